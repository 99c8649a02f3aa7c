from __future__ import annotations

import itertools

import pytest

from durablesched import InvalidTransitionError, TaskState
from durablesched.states import TRANSITIONS, check_transition

ALLOWED = {
    ("PENDING", "RUNNING"),
    ("PENDING", "CANCELLED"),
    ("RUNNING", "SUCCEEDED"),
    ("RUNNING", "RETRY_WAIT"),
    ("RUNNING", "FAILED"),
    ("RUNNING", "CANCELLED"),
    ("RETRY_WAIT", "RUNNING"),
    ("RETRY_WAIT", "CANCELLED"),
}


def test_values_are_the_upper_case_names() -> None:
    assert [s.value for s in TaskState] == [s.name for s in TaskState]
    assert {s.value for s in TaskState} == {
        "PENDING",
        "RUNNING",
        "SUCCEEDED",
        "RETRY_WAIT",
        "FAILED",
        "CANCELLED",
    }


def test_exactly_the_documented_transitions() -> None:
    assert {(a.value, b.value) for a, b in TRANSITIONS} == ALLOWED


@pytest.mark.parametrize(("old", "new"), list(itertools.product(TaskState, TaskState)))
def test_every_other_transition_is_refused(old: TaskState, new: TaskState) -> None:
    if (old.value, new.value) in ALLOWED:
        check_transition(old, new)
    else:
        with pytest.raises(InvalidTransitionError, match=f"{old} -> {new}"):
            check_transition(old, new)
