"""Every public name is documented: each name of ``durablesched.__all__`` in docs/api.md,
and the public members of the classes people call (a new method without a word in the
docs fails here, naming it)."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

import durablesched

API = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text()

#: The classes whose every public member docs/api.md must name.
CLASSES = ("Scheduler", "Worker", "TaskRegistry", "TaskContext", "TaskHandle", "Task")
#: Members of other classes that are public API too.
MEMBERS = {"PostgresStore": ("server_time", "server_clock"), "HealthReport": ("healthy",)}


def _named(name: str) -> bool:
    """``name`` in backticks, alone or as the start of a call or a qualified name."""
    return re.search(rf"`(durablesched\.)?{re.escape(name)}[`(\[]", API) is not None or (
        re.search(rf"`[^`]*\b{re.escape(name)}\b[^`]*`", API) is not None
    )


def test_every_exported_name_is_in_the_api_docs() -> None:
    missing = [n for n in durablesched.__all__ if not _named(n)]
    assert missing == [], f"docs/api.md never names {missing}"


@pytest.mark.parametrize("cls", CLASSES)
def test_every_public_member_of_the_classes_people_call_is_documented(cls: str) -> None:
    members = [n for n, _ in inspect.getmembers(getattr(durablesched, cls)) if n[0] != "_"]
    missing = [n for n in members if not _named(n)]
    assert missing == [], f"docs/api.md never names {cls}.{missing}"


@pytest.mark.parametrize(("cls", "names"), MEMBERS.items())
def test_the_listed_members_of_other_classes_are_documented(cls: str, names: tuple[str]) -> None:
    assert all(hasattr(getattr(durablesched, cls), n) for n in names)
    assert [n for n in names if not _named(n)] == []


def test_the_check_itself_fails_for_a_name_the_docs_lack() -> None:
    assert not _named("NoSuchPublicName") and _named("Scheduler") and _named("server_time")
