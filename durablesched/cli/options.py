"""Options bound to environment variables, and their defaults, in one place.

``--some-option`` can also be set as ``DURABLESCHED_SOME_OPTION``: a flag on the
command line wins over the variable, the variable over the default, and
``--help`` names both. Command modules add their options only through here.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any, NoReturn

from durablesched.cli.errors import EXIT_USAGE
from durablesched.records import Environment

ENV_PREFIX = "DURABLESCHED_"

#: Defaults of the options bound to a variable, by option name.
DEFAULTS: dict[str, str] = {
    "db": "./durablesched.db",
    "durability": "full",
    "concurrency": "4",
    "lease": "30",
    "grace": "30",
    "log_level": "info",
    "environment": Environment.THREAD.value,
    "cancel_grace": "5",
    "args": "{}",
    "limit": "50",
    # Options without a variable, by command: --batch means rows for purge, tasks for move.
    "purge_batch": "10000",
    "move_batch": "500",
}

#: A command: parsed options in, exit code out.
CommandFunc = Callable[[argparse.Namespace], int]


class Parser(argparse.ArgumentParser):
    """A usage error is one line, without argparse's usage text, and exits 2."""

    #: The subcommands' names, set on the top-level parser by ``build_parser``.
    commands: tuple[str, ...] = ()

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def env_name(option: str) -> str:
    """The variable that sets ``option`` (``log-level`` -> ``DURABLESCHED_LOG_LEVEL``)."""
    return ENV_PREFIX + option.upper().replace("-", "_")


def option(
    parser: argparse.ArgumentParser,
    flag: str,
    *,
    help: str,
    suppress: bool = False,
    **kw: Any,
) -> None:
    """Add ``--flag`` whose default comes from DURABLESCHED_FLAG, then ``DEFAULTS``.

    With ``suppress``, an absent flag sets nothing, so that the same option
    given before the subcommand is kept.
    """
    name = flag.lstrip("-")
    env = env_name(name)
    fallback = DEFAULTS.get(name.replace("-", "_"))
    value: Any = argparse.SUPPRESS if suppress else os.environ.get(env, fallback)
    shown = f" (default: {fallback})" if fallback is not None else ""
    parser.add_argument(flag, default=value, help=f"{help}{shown} (env: {env})", **kw)


def switch(
    parser: argparse.ArgumentParser, flag: str, *, help: str, suppress: bool = False
) -> None:
    """Add an on/off ``--flag``, on when DURABLESCHED_FLAG is set to anything but 0/false/no."""
    env = env_name(flag.lstrip("-"))
    on = os.environ.get(env, "").lower() not in ("", "0", "false", "no")
    parser.add_argument(
        flag,
        action="store_true",
        default=argparse.SUPPRESS if suppress else on,
        help=f"{help} (env: {env})",
    )


class Commands:
    """Where each command module adds its subcommands; each takes the common options too."""

    def __init__(self, parser: Parser, common: Parser) -> None:
        self._sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
        self._common = common
        self.names: list[str] = []

    def add(self, name: str, func: CommandFunc, help: str) -> argparse.ArgumentParser:
        """A subcommand that runs ``func``; ``help`` is its line in the list and its description."""
        command = self._sub.add_parser(name, help=help, description=help, parents=[self._common])
        command.set_defaults(func=func)
        self.names.append(name)
        return command
