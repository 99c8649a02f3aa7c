"""The typed API's call sites, checked by mypy: a wrong argument type at ``enqueue`` (or
``bind``, ``ctx.enqueue``) fails, the right ones pass, and the handle's result is typed."""

from __future__ import annotations

from pathlib import Path

from mypy import api

PRELUDE = """
import asyncio

from durablesched import (
    DurableSchedError, Scheduler, TaskContext, TaskHandle, TaskRegistry, MemoryStore
)

registry = TaskRegistry()
scheduler = Scheduler(MemoryStore(), registry=registry)

@registry.task("send")
def send(to: str, *, subject: str = "") -> bool:
    return True

@registry.task("fetch")
async def fetch(url: str) -> bytes:
    return b""

@registry.task("report", pass_context=True)
def report(ctx: TaskContext, month: int) -> str:
    child: TaskHandle[bool] = ctx.enqueue(send, "ops@example.com", subject="done")
    return str(month)

handles: list[TaskHandle[bool]] = scheduler.enqueue_many([send.bind("a"), send.bind("b")])
"""

RIGHT = (
    PRELUDE
    + """
sent: TaskHandle[bool] = scheduler.enqueue(send, "ada@example.com", subject="hi")
ok: bool = sent.result(timeout=1)
page: bytes = scheduler.enqueue(fetch, "https://example.com").result()
text: str = scheduler.enqueue(report.options(delay=60, queue="reports"), 7).result()
again: TaskHandle[str] = scheduler.handle(sent.id, report)
direct: bool = send("ada@example.com")  # still the function
gathered: list[bool] = scheduler.gather(*handles, timeout=5)
some: list[bool | DurableSchedError] = scheduler.gather(*handles, return_exceptions=True)

async def main() -> None:
    result: bytes = await scheduler.enqueue(fetch, "x")
    other: bool = await (await scheduler.aenqueue(send, "y")).aresult(timeout=1)
    many: list[bool] = await asyncio.gather(*(h.aresult() for h in handles))
    waited: bool = await asyncio.wait_for(sent.aresult(), 1)
    pending: asyncio.Future[bool] = sent.aresult(timeout=1)
    all_of: list[bool] = await scheduler.agather(*handles, timeout=5)
"""
)

#: Each wrong call, and the line of mypy's complaint that must name it.
WRONG = {
    "scheduler.enqueue(send, 42)": 'No overload variant of "enqueue"',
    'scheduler.enqueue(send, "a", subject=3)': 'incompatible type "int"; expected "str"',
    'scheduler.enqueue(send, "a", body="x")': 'Unexpected keyword argument "body"',
    'scheduler.enqueue(report, "July")': 'No overload variant of "enqueue"',
    "scheduler.enqueue(fetch)": 'No overload variant of "enqueue"',
    "send.bind(1)": 'No overload variant of "bind"',
    'x: str = scheduler.enqueue(send, "a").result()': "Incompatible types in assignment",
    'y: str = scheduler.enqueue(fetch, "u").result()': "Incompatible types in assignment",
    'z: asyncio.Future[str] = scheduler.enqueue(send, "a").aresult()': (
        "Incompatible types in assignment"
    ),
    "w: list[str] = scheduler.gather(*handles)": 'incompatible type "*list[TaskHandle[bool]]"',
    "v: list[bool] = scheduler.gather(*handles, return_exceptions=True)": (
        "Incompatible types in assignment"
    ),
}


def check(tmp_path: Path, source: str) -> tuple[str, int]:
    path = tmp_path / "calls.py"
    path.write_text(source)
    out, err, status = api.run(
        ["--strict", "--no-error-summary", "--cache-dir", str(tmp_path / "cache"), str(path)]
    )
    return out + err, status


def test_the_right_calls_pass(tmp_path: Path) -> None:
    out, status = check(tmp_path, RIGHT)
    assert status == 0, out


def test_each_wrong_call_fails(tmp_path: Path) -> None:
    lines = list(WRONG)
    source = PRELUDE + "\n" + "\n".join(lines) + "\n"
    out, status = check(tmp_path, source)
    assert status == 1, out
    numbers = {text: n for n, text in enumerate(source.splitlines(), start=1)}
    for call, complaint in WRONG.items():
        line = numbers[call]
        said = [row for row in out.splitlines() if f"calls.py:{line}:" in row]
        assert any(complaint in row for row in said), f"{call!r} (line {line}):\n{out}"
