from __future__ import annotations

import durablesched


def test_all_is_complete_and_sorted() -> None:
    public = {
        name
        for name, value in vars(durablesched).items()
        if not name.startswith("_") and getattr(value, "__module__", "").startswith("durablesched")
    }
    # Names imported when first used (the stores, open_store) are public too, whether
    # or not something has named them yet.
    lazy = set(durablesched._LAZY)
    assert public | lazy == set(durablesched.__all__)
    assert durablesched.__all__ == sorted(durablesched.__all__)


def test_every_lazy_name_resolves_to_what_it_names() -> None:
    for name, module in durablesched._LAZY.items():
        value = getattr(durablesched, name)
        assert value.__name__ == name
        assert value.__module__ == module
