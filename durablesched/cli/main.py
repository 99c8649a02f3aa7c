"""The ``durablesched`` command: migrate, run workers, operate the queue.

Every option can also come from an environment variable ``DURABLESCHED_<OPTION>``;
``--help`` names it. Exit codes: 0 success, 1 not found or refused, 2 usage error.
A refusal or usage error is one line on stderr; with ``--json``, one JSON object.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Sequence

from durablesched.cli.errors import (
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_USAGE,
    Refused,
    UsageError,
    error_line,
)
from durablesched.cli.options import CommandFunc, env_name, switch_is_on
from durablesched.cli.parser import build_parser
from durablesched.errors import DurableSchedError

PROG = "durablesched"


def argv_command(argv: Sequence[str] | None, commands: Sequence[str]) -> str | None:
    """The subcommand named in ``argv``, before parsing (it sets the log level)."""
    words = list(sys.argv[1:] if argv is None else argv)
    return next((w for w in words if w in commands), None)


def wants_json(argv: Sequence[str] | None) -> bool:
    """``--json`` on the command line or in the environment, known before parsing,
    so that an error found while parsing is reported as JSON too."""
    words = list(sys.argv[1:] if argv is None else argv)
    options = words[: words.index("--")] if "--" in words else words
    return "--json" in options or switch_is_on(env_name("json"))


def report(message: str, code: int, *, prog: str = PROG, as_json: bool) -> int:
    """One line on stderr saying what went wrong; returns the exit code."""
    # A lone surrogate from argv (bytes that are not UTF-8) is shown escaped, and a
    # database's message over several lines (PostgreSQL's hints) becomes one.
    message = message.encode("utf-8", "backslashreplace").decode("utf-8")
    message = " ".join(line.strip() for line in message.splitlines() if line.strip())
    if as_json:
        print(json.dumps({"error": message, "exit_code": code}, ensure_ascii=True), file=sys.stderr)
    elif code == EXIT_USAGE:
        print(f"{prog}: error: {message}", file=sys.stderr)
    else:
        print(f"{prog}: {message}", file=sys.stderr)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    logging.basicConfig(
        level=logging.INFO if argv_command(argv, parser.commands) == "worker" else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    as_json = wants_json(argv)
    try:
        args = parser.parse_args(argv)
        as_json = args.json
        if args.command is None:
            if not as_json:
                print(parser.format_usage().rstrip(), file=sys.stderr)
            raise UsageError(f"no command given: '{PROG} --help' says what each command does")
        func: CommandFunc = args.func
        return func(args)
    except BrokenPipeError:
        return EXIT_OK
    except UsageError as e:
        return report(str(e), EXIT_USAGE, prog=e.prog, as_json=as_json)
    except Refused as e:
        return report(str(e), EXIT_REFUSED, as_json=as_json)
    except DurableSchedError as e:
        return report(error_line(e), EXIT_REFUSED, as_json=as_json)
