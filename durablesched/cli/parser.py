"""The command line: the options every command takes, and each command module's own.

Adding a command family is adding its ``register`` to ``REGISTRATIONS``.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import metadata

from durablesched.cli import (
    check,
    dashboard,
    metrics,
    operate,
    queues,
    schedules,
    schema,
    tasks,
    worker,
    workers,
    workflows,
)
from durablesched.cli.options import Commands, Parser, option, switch

#: Each command module adds its commands; their order is the order in ``--help``.
REGISTRATIONS: tuple[Callable[[Commands], None], ...] = (
    schema.register,
    worker.register,
    tasks.register,
    workflows.register,
    operate.register,
    queues.register,
    check.register,
    schedules.register,
    workers.register,
    metrics.register,
    dashboard.register,
)


def common_options(*, suppress: bool) -> Parser:
    """The options every command takes, before or after the subcommand's name."""
    common = Parser(add_help=False)
    option(
        common,
        "--db",
        help="SQLite file path or sqlite:/// URL, or a postgresql:// URL",
        suppress=suppress,
    )
    option(
        common,
        "--durability",
        help="'full' survives power loss; 'normal' survives crashes and is faster",
        suppress=suppress,
    )
    switch(common, "--json", help="print JSON for scripts instead of tables", suppress=suppress)
    return common


def version() -> str:
    """The installed package's version, from its metadata (no import of the package itself)."""
    try:
        return metadata.version("durablesched")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def build_parser() -> Parser:
    parser = Parser(
        prog="durablesched",
        description="A durable job queue in one SQLite file. Exit codes: 0 success, "
        "1 not found or refused, 2 usage error.",
        parents=[common_options(suppress=False)],
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {version()}", help="print the version"
    )
    commands = Commands(parser, common_options(suppress=True))
    for register in REGISTRATIONS:
        register(commands)
    parser.commands = tuple(commands.names)
    return parser
