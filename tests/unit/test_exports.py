from __future__ import annotations

import durablesched


def test_all_is_complete_and_sorted() -> None:
    public = {
        name
        for name, value in vars(durablesched).items()
        if not name.startswith("_") and getattr(value, "__module__", "").startswith("durablesched")
    }
    assert public == set(durablesched.__all__)
    assert durablesched.__all__ == sorted(durablesched.__all__)
