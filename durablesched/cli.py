"""The ``durablesched`` command: migrate, run workers, operate the queue.

Every option can also come from an environment variable ``DURABLESCHED_<OPTION>``;
``--help`` names it. Exit codes: 0 success, 1 not found or refused, 2 usage error.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any, NoReturn

from .errors import DurableSchedError
from .migrate import upgrade
from .registry import TaskRegistry
from .scheduler import Scheduler
from .sqlite import SQLiteStore, create_sqlite_engine
from .worker import Worker

EXIT_OK, EXIT_REFUSED, EXIT_USAGE = 0, 1, 2
ENV_PREFIX = "DURABLESCHED_"

#: Defaults, in one place.
DEFAULTS: dict[str, str] = {
    "db": "./durablesched.db",
    "durability": "full",
    "concurrency": "4",
    "lease": "30",
    "grace": "30",
}

log = logging.getLogger("durablesched.cli")


class UsageError(Exception):
    """A bad argument: exit 2 with a one-line message naming it."""


class Refused(Exception):
    """Not found or not allowed: exit 1."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _env(option: str) -> str:
    return ENV_PREFIX + option.upper().replace("-", "_")


def _option(
    parser: argparse.ArgumentParser, flag: str, *, help: str, default: str | None = None, **kw: Any
) -> None:
    """Add ``--flag`` whose default comes from DURABLESCHED_FLAG, then ``default``."""
    name = flag.lstrip("-")
    env = _env(name)
    fallback = DEFAULTS.get(name.replace("-", "_"), default)
    value = os.environ.get(env, fallback)
    shown = f" (default: {fallback})" if fallback is not None else ""
    parser.add_argument(flag, default=value, help=f"{help}{shown} (env: {env})", **kw)


def _positive_int(what: str, value: str) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise UsageError(f"{what} must be a whole number, got {value!r}") from None
    if number < 1:
        raise UsageError(f"{what} must be at least 1, got {number}")
    return number


def _positive_float(what: str, value: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise UsageError(f"{what} must be a number of seconds, got {value!r}") from None
    if not number > 0:
        raise UsageError(f"{what} must be positive, got {value}")
    return number


def _durability(value: str) -> Any:
    if value not in ("full", "normal"):
        raise UsageError(f"--durability must be 'full' or 'normal', got {value!r}")
    return value


def load_registry(spec: str) -> TaskRegistry:
    """Import ``MODULE[:ATTR]`` and return the TaskRegistry it names.

    Without ``:ATTR``, the module's ``registry`` attribute, or its only TaskRegistry.
    """
    module_name, _, attr = spec.partition(":")
    if not module_name:
        raise UsageError(f"--app must be MODULE[:ATTR], got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        raise UsageError(f"--app: cannot import module {module_name!r} ({e})") from None
    if attr:
        found = getattr(module, attr, None)
        if not isinstance(found, TaskRegistry):
            raise UsageError(f"--app: {module_name}.{attr} is not a durablesched TaskRegistry")
        return found
    registries = [v for v in vars(module).values() if isinstance(v, TaskRegistry)]
    named = getattr(module, "registry", None)
    if isinstance(named, TaskRegistry):
        return named
    if len(registries) == 1:
        return registries[0]
    raise UsageError(
        f"--app: module {module_name!r} has {len(registries)} TaskRegistry objects; "
        "name one as MODULE:ATTR"
    )


# -- commands ----------------------------------------------------------------------------------


def cmd_migrate(args: argparse.Namespace) -> int:
    engine = create_sqlite_engine(args.db, durability=_durability(args.durability))
    try:
        revision = upgrade(engine)
    finally:
        engine.dispose()
    print(f"schema at revision {revision}")
    return EXIT_OK


def cmd_worker(args: argparse.Namespace) -> int:
    registry = load_registry(args.app)
    concurrency = _positive_int("--concurrency", args.concurrency)
    lease = _positive_float("--lease", args.lease)
    grace = _positive_float("--grace", args.grace)
    store = SQLiteStore(args.db, durability=_durability(args.durability))
    scheduler = Scheduler(store, registry=registry)
    worker = Worker(scheduler, concurrency=concurrency, lease=lease)
    signals_seen = 0

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        nonlocal signals_seen
        signals_seen += 1
        if signals_seen > 1:
            log.warning("second signal: exiting at once; held leases will expire and be reclaimed")
            os._exit(128 + signum)
        log.info("signal %s: no new claims; waiting up to %ss for running tasks", signum, grace)
        worker.request_stop()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    log.info(
        "worker %s: %s slots, lease %ss, tasks %s",
        worker.owner,
        concurrency,
        lease,
        ", ".join(registry) or "(none)",
    )
    try:
        worker.run(burst=args.burst)
        released = worker.shutdown(grace)
        if released:
            log.warning("gave back %s unfinished task(s) as PENDING", released)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        store.close()
    return EXIT_OK


# -- the parser --------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="durablesched", description=__doc__.splitlines()[0] if __doc__ else None)
    _option(parser, "--db", help="database path or SQLAlchemy sqlite URL")
    _option(
        parser,
        "--durability",
        help="'full' survives power loss; 'normal' survives crashes, is faster",
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("migrate", help="create or upgrade the schema and print its revision")
    p.set_defaults(func=cmd_migrate)

    p = sub.add_parser("worker", help="run a worker process")
    _option(p, "--app", help="the task registry to run, as MODULE[:ATTR]", required=False)
    _option(p, "--concurrency", help="how many tasks run at once")
    _option(p, "--lease", help="lease length in seconds; heartbeats renew it")
    _option(p, "--grace", help="seconds running tasks get to finish after SIGTERM")
    p.add_argument(
        "--burst",
        action="store_true",
        default=os.environ.get(_env("burst"), "") not in ("", "0", "false"),
        help=f"exit 0 once nothing is due or running (env: {_env('burst')})",
    )
    p.set_defaults(func=cmd_worker)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        if getattr(args, "app", "missing") is None:
            raise UsageError("--app is required (or set DURABLESCHED_APP)")
        return func(args)
    except UsageError as e:
        print(f"durablesched: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except Refused as e:
        print(f"durablesched: {e}", file=sys.stderr)
        return EXIT_REFUSED
    except DurableSchedError as e:
        print(f"durablesched: {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_REFUSED
