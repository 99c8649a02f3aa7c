"""Commands on workflows (docs/workflows.md): ``signal``, and what ``show`` and
``retry --from-step`` add for a workflow."""

from __future__ import annotations

import argparse
import json
from typing import Any

from durablesched.cli.database import open_db
from durablesched.cli.errors import EXIT_OK, Refused, UsageError
from durablesched.cli.options import Commands, option
from durablesched.cli.output import print_json, table, when
from durablesched.cli.values import task_id
from durablesched.errors import InvalidTaskError, InvalidTransitionError, TaskNotFoundError
from durablesched.store.protocol import Store


def register(commands: Commands) -> None:
    p = commands.add(
        "signal", cmd_signal, "send a workflow a signal (its ctx.wait_for_signal(NAME) takes it)"
    )
    p.add_argument("id", help="task id")
    p.add_argument("name", help="the signal's name")
    option(p, "--payload", help="the signal's payload as JSON (default: null)")


def _payload(value: str | None) -> Any:
    if value is None:
        return None
    try:
        return json.loads(value)
    except RecursionError:
        raise UsageError("--payload is nested too deeply") from None
    except ValueError as e:  # JSONDecodeError, or a number too long to convert
        raise UsageError(f"--payload is not valid JSON: {e}") from None


def cmd_signal(args: argparse.Namespace) -> int:
    from durablesched.scheduler import Scheduler

    wanted = task_id(args.id)
    if not args.name:
        raise UsageError("the signal's name must not be empty")
    payload = _payload(args.payload)
    store = open_db(args)
    try:
        signal_id = Scheduler(store).signal(wanted, args.name, payload)
    except InvalidTaskError as e:
        raise UsageError(str(e)) from None
    except (TaskNotFoundError, InvalidTransitionError) as e:
        raise Refused(str(e)) from None
    finally:
        store.close()
    if args.json:
        print_json({"id": wanted, "signal": args.name, "signal_id": signal_id})
    else:
        print(f"task {wanted}: signal {args.name!r} sent (signal {signal_id})")
    return EXIT_OK


def step_position(value: str) -> int:
    """``--from-step``: a step's position, from 0."""
    try:
        position = int(value)
    except ValueError:
        raise UsageError(f"--from-step must be a whole number, got {value!r}") from None
    if not 0 <= position <= 2**31 - 1:
        raise UsageError(f"--from-step must be 0 or more, got {position}")
    return position


def workflow_of(store: Store, task_id: int) -> dict[str, Any]:
    """A task's steps, signals and children, as ``show --json`` gives them."""
    return {
        "steps": [
            {
                "position": s.position,
                "name": s.name,
                "result_size": len(json.dumps(s.result, ensure_ascii=False)),
                "recorded_at": s.recorded_at,
                "attempt": s.attempt,
            }
            for s in store.steps(task_id)
        ],
        "signals": [
            {
                "id": s.id,
                "name": s.name,
                "sent_at": s.sent_at,
                "taken_at": s.consumed_at,
                "taken_by_step": s.consumed_position,
            }
            for s in store.signals(task_id)
        ],
        "children": [
            {"id": c, "name": r.name if r else None, "state": r.state if r else None}
            for c in store.children(task_id)
            for r in [store.get(c)]
        ],
    }


def print_workflow(flow: dict[str, Any]) -> None:
    """The steps (sleeps and waits among them), signals and children, where there are."""
    if flow["steps"]:
        print("\nsteps:")
        rows = [
            [s["position"], s["name"], s["result_size"], when(s["recorded_at"]), s["attempt"]]
            for s in flow["steps"]
        ]
        print(table(["step", "name", "result bytes", "recorded", "attempt"], rows))
    if flow["signals"]:
        print("\nsignals:")
        rows = [
            [s["id"], s["name"], when(s["sent_at"]), when(s["taken_at"]), s["taken_by_step"]]
            for s in flow["signals"]
        ]
        print(table(["id", "name", "sent", "taken", "by step"], rows))
    if flow["children"]:
        print("\nchildren (durablesched show ID):")
        rows = [[c["id"], c["name"], c["state"]] for c in flow["children"]]
        print(table(["id", "name", "state"], rows))
