"""``durablesched migrate``: create or upgrade the schema through Alembic.

Only upgrades: there is no way down from here (docs/cli.md says why).
"""

from __future__ import annotations

import argparse

from durablesched.cli.database import check_db
from durablesched.cli.errors import EXIT_OK
from durablesched.cli.options import Commands
from durablesched.cli.output import print_json
from durablesched.cli.values import durability_of


def register(commands: Commands) -> None:
    commands.add("migrate", cmd_migrate, "create or upgrade the schema and print its revision")


def cmd_migrate(args: argparse.Namespace) -> int:
    from durablesched.store.opening import open_store

    db = check_db(args.db)
    # Through the store, as every other command opens the database: a file that
    # is not a durablesched database, or is damaged, is refused in one line.
    store = open_store(db, durability=durability_of(args.durability), migrate=True)
    try:
        revision = store.schema_revision
    finally:
        store.close()
    if args.json:
        print_json({"revision": revision})
    else:
        print(f"schema at revision {revision}")
    return EXIT_OK
