"""The ``durablesched`` command: migrate, run workers, operate the queue.

Every option can also come from an environment variable ``DURABLESCHED_<OPTION>``;
``--help`` names it. Exit codes: 0 success, 1 not found or refused, 2 usage error.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from durablesched.cli.errors import EXIT_OK, EXIT_REFUSED, EXIT_USAGE, Refused, UsageError
from durablesched.cli.options import CommandFunc
from durablesched.cli.parser import build_parser
from durablesched.errors import DurableSchedError


def argv_command(argv: Sequence[str] | None, commands: Sequence[str]) -> str | None:
    """The subcommand named in ``argv``, before parsing (it sets the log level)."""
    words = list(sys.argv[1:] if argv is None else argv)
    return next((w for w in words if w in commands), None)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    logging.basicConfig(
        level=logging.INFO if argv_command(argv, parser.commands) == "worker" else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    args = parser.parse_args(argv)
    func: CommandFunc = args.func
    try:
        return func(args)
    except BrokenPipeError:
        return EXIT_OK
    except UsageError as e:
        print(f"durablesched: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except Refused as e:
        print(f"durablesched: {e}", file=sys.stderr)
        return EXIT_REFUSED
    except DurableSchedError as e:
        print(f"durablesched: {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_REFUSED
