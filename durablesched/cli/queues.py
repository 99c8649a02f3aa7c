"""``durablesched queue ls|set|pause|resume``: named queues, their global limits and their
limits per key."""

from __future__ import annotations

import argparse
from datetime import timedelta
from typing import TYPE_CHECKING

from durablesched.cli.database import open_db
from durablesched.cli.errors import EXIT_OK, UsageError
from durablesched.cli.options import Commands, setting
from durablesched.cli.output import print_json, table
from durablesched.cli.values import positive_int
from durablesched.clock import SystemClock
from durablesched.errors import InvalidTaskError

if TYPE_CHECKING:
    from durablesched.queues import QueueInfo, QueueLimits

ACTIONS = ("ls", "set", "pause", "resume")


def register(commands: Commands) -> None:
    p = commands.add("queue", cmd_queue, "list queues, or set, pause or resume one")
    p.add_argument("action", choices=ACTIONS, help="ls, set, pause or resume")
    p.add_argument("name", nargs="?", help="the queue (not for ls)")
    setting(
        p,
        "--concurrency",
        help="at most this many of its tasks RUNNING at once across every worker ('none' lifts it)",
    )
    setting(
        p,
        "--rate",
        help="at most COUNT starts per window across every worker: 10/s, 100/m, 5/10s, "
        "1000/h ('none' lifts it)",
    )
    setting(
        p,
        "--concurrency-per-key",
        help="at most this many of its tasks of one limit_key RUNNING at once across every "
        "worker ('none' lifts it)",
    )
    setting(
        p,
        "--rate-per-key",
        help="at most COUNT starts of one limit_key per window across every worker: 5/s, "
        "100/m ('none' lifts it)",
    )


def cmd_queue(args: argparse.Namespace) -> int:
    limits_given = any(
        v is not None
        for v in (args.concurrency, args.rate, args.concurrency_per_key, args.rate_per_key)
    )
    if args.action == "ls":
        if args.name is not None or limits_given:
            raise UsageError("queue ls takes no queue name and no limits")
        return _ls(args)
    if args.name is None:
        raise UsageError(f"queue {args.action} needs the queue's name")
    if args.action != "set" and limits_given:
        raise UsageError(
            f"queue {args.action} takes no --concurrency, --rate, --concurrency-per-key "
            "or --rate-per-key"
        )
    if args.action == "set" and not limits_given:
        raise UsageError(
            "queue set needs --concurrency, --rate, --concurrency-per-key or --rate-per-key"
        )
    changes = _changes(args)
    from durablesched.scheduler import Scheduler

    store = open_db(args, readonly=False)
    try:
        scheduler = Scheduler(store)
        known = {q.name for q in scheduler.queues()}
        try:
            limits = scheduler.set_queue(args.name, **changes)  # type: ignore[arg-type]
        except InvalidTaskError as e:
            raise UsageError(str(e)) from None
    finally:
        store.close()
    if args.json:
        print_json({"created": args.name not in known, **_limits_dict(limits)})
        return EXIT_OK
    if args.name not in known:
        print(f"queue {args.name!r} did not exist: made it")
    print(f"queue {args.name!r}: {_describe(limits)}")
    return EXIT_OK


def _changes(args: argparse.Namespace) -> dict[str, object]:
    """What the command asks to change, checked: exit 2 naming the option if wrong."""
    from durablesched.queues import Rate, check_queue

    try:
        check_queue(args.name, "the queue's name")
    except InvalidTaskError as e:
        raise UsageError(str(e)) from None
    if args.action in ("pause", "resume"):
        return {"paused": args.action == "pause"}
    changes: dict[str, object] = {}
    if args.concurrency is not None:
        none = args.concurrency.strip().lower() == "none"
        changes["concurrency"] = (
            None if none else positive_int("--concurrency", args.concurrency, maximum=2**31 - 1)
        )
    if args.concurrency_per_key is not None:
        none = args.concurrency_per_key.strip().lower() == "none"
        changes["concurrency_per_key"] = (
            None
            if none
            else positive_int("--concurrency-per-key", args.concurrency_per_key, maximum=2**31 - 1)
        )
    for option, name, given in (
        ("--rate", "rate", args.rate),
        ("--rate-per-key", "rate_per_key", args.rate_per_key),
    ):
        if given is None:
            continue
        if given.strip().lower() == "none":
            changes[name] = None
        else:
            try:
                changes[name] = Rate.parse(given)
            except InvalidTaskError as e:
                raise UsageError(f"{option}: {e}") from None
    return changes


def _ls(args: argparse.Namespace) -> int:
    store = open_db(args, readonly=True)
    try:
        infos = store.queue_info(SystemClock().now())
    finally:
        store.close()
    if args.json:
        print_json(infos)
        return EXIT_OK
    rows = [
        [
            q["name"],
            "paused" if q["paused"] else "active",
            q["counts"]["PENDING"] + q["counts"]["RETRY_WAIT"],
            q["running"],
            q["waiting"],
            "-" if q["concurrency"] is None else q["concurrency"],
            q["rate"] or "-",
            _per_key(q),
            _age(q),
            q["counts"]["SUCCEEDED"],
            q["counts"]["FAILED"],
            q["counts"]["CANCELLED"],
        ]
        for q in infos
    ]
    headers = ["queue", "state", "waiting", "running", "ahead", "concurrency", "rate"]
    headers += ["per key", "oldest wait"]
    print(table([*headers, "succeeded", "failed", "cancelled"], rows))
    return EXIT_OK


def _per_key(info: QueueInfo) -> str:
    """The concurrency per key and how many keys are at it: ``1 (3 at limit)``."""
    per_key, rate = info["concurrency_per_key"], info["rate_per_key"]
    if per_key is None and rate is None:
        return "-"
    limits = " ".join(str(x) for x in (per_key, rate) if x is not None)
    return f"{limits} ({info['keys_at_limit']} at limit)"


def _age(info: QueueInfo) -> str:
    seconds = info["oldest_waiting_seconds"]
    if seconds is None:
        return "-"
    return str(timedelta(seconds=round(seconds)))


def _limits_dict(limits: QueueLimits) -> dict[str, object]:
    return {
        "name": limits.name,
        "concurrency": limits.concurrency,
        "rate": None if limits.rate is None else str(limits.rate),
        "paused": limits.paused,
        "concurrency_per_key": limits.concurrency_per_key,
        "rate_per_key": None if limits.rate_per_key is None else str(limits.rate_per_key),
    }


def _describe(limits: QueueLimits) -> str:
    parts = [
        "paused" if limits.paused else "active",
        f"concurrency {limits.concurrency if limits.concurrency is not None else 'unlimited'}",
        f"rate {limits.rate if limits.rate is not None else 'unlimited'}",
    ]
    if limits.concurrency_per_key is not None:
        parts.append(f"concurrency per key {limits.concurrency_per_key}")
    if limits.rate_per_key is not None:
        parts.append(f"rate per key {limits.rate_per_key}")
    return ", ".join(parts)
