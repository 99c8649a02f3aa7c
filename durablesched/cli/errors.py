"""What a command can refuse, and the exit code each refusal gives.

``main`` turns these into one line on stderr: a command raises, it never exits.
"""

from __future__ import annotations

from durablesched.errors import CorruptDatabase, DurableSchedError

EXIT_OK, EXIT_REFUSED, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """A bad argument: exit 2 with a one-line message naming it.

    ``prog`` is the command that says so (``durablesched submit`` for an error
    found by a subcommand's parser).
    """

    def __init__(self, message: str, *, prog: str = "durablesched") -> None:
        super().__init__(message)
        self.prog = prog


class Refused(Exception):
    """Not found or not allowed: exit 1."""


def error_line(error: DurableSchedError) -> str:
    """An error as the one line a command ends with: its kind, its message, and, for
    a damaged database, what to do."""
    line = f"{type(error).__name__}: {error}"
    if isinstance(error, CorruptDatabase):
        line += f"; {error.advice}"
    return line
