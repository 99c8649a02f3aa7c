"""The in-process CLI fixtures (``run``, ``db``) for every unit test module that drives the CLI."""

from .test_cli_edges import db, run

__all__ = ["db", "run"]
