"""How hard a commit tries to survive power loss: one name per mode, for every database."""

from __future__ import annotations

from typing import Literal

from durablesched.errors import ConfigurationError

#: "full" survives power loss; "normal" may lose the last commits then (docs/durability.md).
Durability = Literal["full", "normal"]
DURABILITIES: tuple[Durability, ...] = ("full", "normal")


def durability(value: str) -> Durability:
    """``value`` as a :data:`Durability`, or a ConfigurationError naming the choices."""
    if value not in DURABILITIES:
        raise ConfigurationError(
            f"durability must be {' or '.join(map(repr, DURABILITIES))}, got {value!r}"
        )
    return value
