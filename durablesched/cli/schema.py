"""``durablesched migrate``: create or upgrade the schema through Alembic."""

from __future__ import annotations

import argparse

from durablesched.cli.errors import EXIT_OK
from durablesched.cli.options import Commands
from durablesched.cli.values import durability_of


def register(commands: Commands) -> None:
    commands.add("migrate", cmd_migrate, "create or upgrade the schema and print its revision")


def cmd_migrate(args: argparse.Namespace) -> int:
    from durablesched.store.opening import create_engine_for
    from durablesched.store.sql.migrate import upgrade

    engine = create_engine_for(args.db, durability=durability_of(args.durability))
    try:
        revision = upgrade(engine)
    finally:
        engine.dispose()
    print(f"schema at revision {revision}")
    return EXIT_OK
