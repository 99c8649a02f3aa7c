"""Commands on workflows (docs/workflows.md): ``signal``."""

from __future__ import annotations

import argparse
import json
from typing import Any

from durablesched.cli.database import open_db
from durablesched.cli.errors import EXIT_OK, Refused, UsageError
from durablesched.cli.options import Commands, option
from durablesched.cli.output import print_json
from durablesched.cli.values import task_id
from durablesched.errors import InvalidTaskError, InvalidTransitionError, TaskNotFoundError


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
