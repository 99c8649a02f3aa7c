"""The CLI tests share the process fixtures: a migrated file with a ledger, and workers."""

from ..processes.conftest import db as db
from ..processes.conftest import workers as workers
