"""examples/fastapi: a real server (uvicorn, in a thread) and a worker on one SQLite file;
a request enqueues, the result streams back as Server-Sent Events when ready, and a long
poll answers with the result, or 202 while the task is not finished."""

from __future__ import annotations

import importlib.util
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import uvicorn

from durablesched import Scheduler, SQLiteStore, Worker

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fastapi" / "app.py"
WAIT = 10.0


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("reports_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, Any]]:
    """The app served on a free port, and the example module."""
    example = load_example()
    db = str(tmp_path / "reports.db")
    config = uvicorn.Config(
        example.create_app(db), host="127.0.0.1", port=0, log_level="warning", lifespan="on"
    )
    app_server = uvicorn.Server(config)
    thread = threading.Thread(target=app_server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + WAIT
    while not app_server.started:  # a bounded poll for an observable condition
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    port = app_server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", example
    finally:
        app_server.should_exit = True
        thread.join(WAIT)


@pytest.fixture
def worker(server: tuple[str, Any], tmp_path: Path) -> Iterator[Worker]:
    _, example = server
    store = SQLiteStore(tmp_path / "reports.db")
    running = Worker(Scheduler(store, registry=example.registry), concurrency=2)
    thread = threading.Thread(target=running.run, daemon=True)
    thread.start()
    try:
        yield running
    finally:
        running.stop()
        thread.join(WAIT)
        store.close()


def post(url: str) -> Any:
    with urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=WAIT) as r:
        return json.loads(r.read())


def test_a_request_enqueues_and_the_result_streams_back(
    server: tuple[str, Any], worker: Worker
) -> None:
    base, _ = server
    made = post(f"{base}/reports?month=3&region=north")
    events: list[tuple[str, Any]] = []
    with urllib.request.urlopen(base + made["events"], timeout=WAIT) as stream:
        assert stream.headers["content-type"].startswith("text/event-stream")
        name = None
        for raw in stream:
            line = raw.decode().rstrip("\n")
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: "):
                events.append((str(name), json.loads(line.removeprefix("data: "))))
    assert [name for name, _ in events] == ["pending", "done"]
    assert events[1][1] == {
        "id": made["id"],
        "result": {"month": 3, "region": "north", "total": sum(range(3000))},
    }
    with urllib.request.urlopen(f"{base}/reports/{made['id']}?wait=5", timeout=WAIT) as r:
        assert json.loads(r.read())["result"]["total"] == sum(range(3000))


def test_a_long_poll_says_202_until_finished_and_404_for_no_task(
    server: tuple[str, Any],
) -> None:
    base, _ = server  # no worker: the task stays PENDING
    made = post(f"{base}/reports?month=1")
    with urllib.request.urlopen(f"{base}/reports/{made['id']}?wait=0.05", timeout=WAIT) as r:
        assert r.status == 202
        assert json.loads(r.read()) == {"id": made["id"], "state": "PENDING"}
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(f"{base}/reports/999/events", timeout=WAIT)
    assert missing.value.code == 404
    missing.value.close()
