"""The ``durablesched`` command."""

from durablesched.cli.main import main as main

__all__ = ["main"]
