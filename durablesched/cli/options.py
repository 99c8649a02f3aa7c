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

from durablesched.cli.errors import UsageError
from durablesched.records import OVERDUE_AFTER, Environment

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
    # A task the worker's --app lacks: left for another worker (Worker's own default).
    "unknown_tasks": "skip",
    # Claims ahead of the slots (Worker's own defaults): docs/performance.md.
    "ahead": "8",
    "ahead_window": "0.05",
    # --burst: how far ahead a retry due or a lease lapsing is waited for.
    "burst_wait": "5",
    # Seconds of store errors in a row a worker backs off from before it stops.
    "give_up_after": "60",
    "args": "{}",
    "limit": "50",
    # --batch means rows for purge and tasks for move: one variable, a default for each.
    "purge_batch": "10000",
    "move_batch": "500",
    # How long past its due time an unclaimed task is reported by `check`.
    "overdue_after": f"{OVERDUE_AFTER.total_seconds():g}s",
    # `dashboard`: this host only unless told (any other address needs a token).
    "host": "127.0.0.1",
    "port": "8787",
    # `schedule add`: the API's defaults (durablesched.schedules.declaration.schedule).
    "timezone": "UTC",
    "misfire": "latest",
    "max_catch_up": "100",
    "misfire_grace": "60s",
    "overlap": "skip",
}

#: A command: parsed options in, exit code out.
CommandFunc = Callable[[argparse.Namespace], int]


class Parser(argparse.ArgumentParser):
    """A usage error is one line, without argparse's usage text, and exits 2."""

    #: The subcommands' names, set on the top-level parser by ``build_parser``.
    commands: tuple[str, ...] = ()

    def error(self, message: str) -> NoReturn:
        # Raised, not printed: ``main`` reports every usage error the same way
        # (one line, or a JSON object with --json) and returns 2.
        raise UsageError(message, prog=self.prog)


def env_name(option: str) -> str:
    """The variable that sets ``option`` (``log-level`` -> ``DURABLESCHED_LOG_LEVEL``)."""
    return ENV_PREFIX + option.upper().replace("-", "_")


def option(
    parser: argparse._ActionsContainer,
    flag: str,
    *,
    help: str,
    suppress: bool = False,
    required: bool = False,
    default: str | None = None,
    variable: str | None = None,
    **kw: Any,
) -> None:
    """Add ``--flag`` whose default comes from DURABLESCHED_FLAG, then ``DEFAULTS``.

    With ``suppress``, an absent flag sets nothing, so that the same option
    given before the subcommand is kept. ``required`` is met by the flag or by
    the variable. ``default`` names the ``DEFAULTS`` entry when it is not the
    option's own name (``--batch`` has one per command); ``variable`` the variable's
    name after the prefix when the flag's would clash with another command's meaning.
    """
    name = flag.lstrip("-")
    env = env_name(variable or name)
    fallback = DEFAULTS.get(default or name.replace("-", "_"))
    value: Any = argparse.SUPPRESS if suppress else os.environ.get(env, fallback)
    shown = f" (default: {fallback})" if fallback is not None else ""
    parser.add_argument(
        flag,
        default=value,
        required=required and env not in os.environ,
        help=f"{help}{shown} (env: {env})",
        **kw,
    )


#: What the help of an option without a variable says, and why it has none.
NO_VARIABLE = "(no variable: a stored setting is only changed when asked)"


def setting(parser: argparse._ActionsContainer, flag: str, *, help: str, **kw: Any) -> None:
    """Add ``--flag`` that changes something stored (a queue's limits): never read from
    the environment, where a variable set for a worker would change it by surprise."""
    parser.add_argument(flag, default=None, help=f"{help} {NO_VARIABLE}", **kw)


def switch(
    parser: argparse.ArgumentParser,
    flag: str,
    *,
    help: str,
    suppress: bool = False,
    variable: str | None = None,
) -> None:
    """Add an on/off ``--flag``, on when DURABLESCHED_FLAG (or ``variable``'s) is set to
    anything but 0/false/no."""
    env = env_name(variable or flag.lstrip("-"))
    parser.add_argument(
        flag,
        action="store_true",
        default=argparse.SUPPRESS if suppress else switch_is_on(env),
        help=f"{help} (env: {env})",
    )


def switch_is_on(env: str) -> bool:
    """A switch's variable is on when set to anything but empty, 0, false or no."""
    return os.environ.get(env, "").lower() not in ("", "0", "false", "no")


class Repeated(argparse.Action):
    """A flag that may be given again: its values joined with commas, the form its
    variable takes too (``--queue a=2 --queue b=1`` is ``DURABLESCHED_QUEUE=a=2,b=1``).
    The first flag on the command line replaces the variable's value."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        seen = getattr(namespace, f"_{self.dest}_given", False)
        current = getattr(namespace, self.dest, None)
        joined = f"{current},{values}" if seen and current else str(values)
        setattr(namespace, self.dest, joined)
        setattr(namespace, f"_{self.dest}_given", True)


class Commands:
    """Where each command module adds its subcommands; each takes the common options too."""

    def __init__(self, parser: Parser, common: Parser) -> None:
        # Not required by argparse: ``main`` answers a bare ``durablesched`` with
        # the usage and a hint instead of argparse's "arguments are required".
        self._sub = parser.add_subparsers(dest="command", parser_class=Parser)
        self._common = common
        self.names: list[str] = []

    def add(self, name: str, func: CommandFunc, help: str) -> argparse.ArgumentParser:
        """A subcommand that runs ``func``; ``help`` is its line in the list and its description."""
        command = self._sub.add_parser(name, help=help, description=help, parents=[self._common])
        command.set_defaults(func=func)
        self.names.append(name)
        return command
