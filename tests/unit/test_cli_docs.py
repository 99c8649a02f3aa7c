"""The options table in docs/cli.md is the parser's, and every variable it names works.

The parser is the one source: the table is rendered from ``build_parser()`` and
must appear in docs/cli.md exactly (a failure prints the table to paste).
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from durablesched.cli.options import NO_VARIABLE
from durablesched.cli.parser import build_parser

DOCS = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
ENV = re.compile(r"\(env: (DURABLESCHED_[A-Z_]+)\)")
DEFAULT = re.compile(r"\(default: ([^)]*)\)")
#: What each command needs on the command line besides options.
POSITIONALS = {
    "submit": ["name"],
    "show": ["1"],
    "cancel": ["1"],
    "retry": ["1"],
    "signal": ["1", "approved"],
    "queue": ["set", "q"],
    "schedule": ["ls"],
}


@dataclass(frozen=True)
class Option:
    command: str  # "" for the options every command takes
    flag: str
    dest: str
    variable: str
    default: str
    switch: bool
    required: bool


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("DURABLESCHED_"):
            monkeypatch.delenv(name)


def commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def options_of(command: str, parser: argparse.ArgumentParser, skip: set[str]) -> Iterator[Option]:
    for action in parser._actions:
        if not action.option_strings or action.dest in skip:
            continue
        (flag,) = [s for s in action.option_strings if s.startswith("--")]
        if NO_VARIABLE in (action.help or ""):
            # A stored setting: never from the environment (cli/options.py says why).
            yield Option(command, flag, action.dest, "", "-", False, action.required)
            continue
        found = ENV.search(action.help or "")
        assert found, f"{command or 'every command'}: {flag} names no DURABLESCHED_ variable"
        default = DEFAULT.search(action.help or "")
        switch = isinstance(action, argparse._StoreTrueAction)
        yield Option(
            command,
            flag,
            action.dest,
            found.group(1),
            "off" if switch else shown(default.group(1)) if default else "-",
            switch,
            action.required,
        )


def shown(default: str) -> str:
    """A value as code, a sentence as it is."""
    return default if " " in default else f"`{default}`"


def all_options() -> list[Option]:
    parser = build_parser()
    common = list(options_of("", parser, {"help", "version", "command"}))
    skip = {"help", *(o.dest for o in common)}
    found = [o for name, p in commands(parser).items() for o in options_of(name, p, skip)]
    return common + found


def render_table() -> str:
    """The docs' options table: one row per option, its variable, default and commands."""
    rows: dict[str, list[Option]] = {}
    for o in all_options():
        rows.setdefault(o.flag, []).append(o)
    lines = ["| option | variable | default | commands |", "| --- | --- | --- | --- |"]
    for flag, found in rows.items():
        by_variable: dict[str, list[str]] = {}
        for o in found:
            by_variable.setdefault(o.variable, []).append(o.command)
        if len(by_variable) == 1:
            (only,) = by_variable
            variable = f"`{only}`" if only else "none (a stored setting)"
        else:
            variable = ", ".join(
                f"`{v}` ({', '.join(c)})" if v else f"none ({', '.join(c)})"
                for v, c in by_variable.items()
            )
        names = ", ".join(o.command for o in found) or "every command"
        by_default: dict[str, list[str]] = {}
        for o in found:
            by_default.setdefault(o.default, []).append(o.command)
        if len(by_default) == 1:
            default = found[0].default
        else:
            default = ", ".join(f"{d} ({', '.join(c)})" for d, c in by_default.items())
        lines.append(f"| `{flag}` | {variable} | {default} | {names} |")
    return "\n".join(lines) + "\n"


def test_docs_cli_md_holds_the_options_table_of_the_parser() -> None:
    table = render_table()
    assert table in DOCS.read_text(), (
        "docs/cli.md must contain exactly this table (paste it in):\n\n" + table
    )


def argv_for(option: Option) -> list[str]:
    """The shortest command line on which ``option`` is left to its variable."""
    parser = commands(build_parser())[option.command] if option.command else None
    command = option.command or "stats"
    argv = [command, *POSITIONALS.get(command, [])]
    if parser is not None:
        for other in options_of(option.command, parser, {"help", "db", "durability", "json"}):
            if other.required and other.flag != option.flag:
                argv += [other.flag, "given"]
    return argv


@pytest.mark.parametrize(
    "option",
    [o for o in all_options() if o.variable],
    ids=lambda o: f"{o.command or 'all'}{o.flag}",
)
def test_every_variable_sets_its_option(option: Option, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(option.variable, "1" if option.switch else "from-the-environment")
    args = build_parser().parse_args(argv_for(option))
    assert getattr(args, option.dest) == (True if option.switch else "from-the-environment")
    # A flag on the command line wins over the variable.
    if not option.switch:
        given = build_parser().parse_args([*argv_for(option), option.flag, "from-the-flag"])
        assert getattr(given, option.dest) == "from-the-flag"
