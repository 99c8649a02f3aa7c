"""Loading the user's task registry from ``--app MODULE[:ATTR]``, as worker and submit do."""

from __future__ import annotations

import importlib
import os
import sys

from durablesched.cli.errors import UsageError
from durablesched.registry import TaskRegistry


def load_registry(spec: str) -> TaskRegistry:
    """Import ``MODULE[:ATTR]`` and return the TaskRegistry it names.

    Without ``:ATTR``, the module's ``registry`` attribute, or its only TaskRegistry.
    The current directory is on the import path, as it is for ``python -m``.
    """
    module_name, _, attr = spec.partition(":")
    if not module_name:
        raise UsageError(f"--app must be MODULE[:ATTR], got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        raise UsageError(f"--app: cannot import module {module_name!r} ({e})") from None
    if attr:
        found = getattr(module, attr, None)
        if not isinstance(found, TaskRegistry):
            raise UsageError(f"--app: {module_name}.{attr} is not a durablesched TaskRegistry")
        return found
    registries = [v for v in vars(module).values() if isinstance(v, TaskRegistry)]
    named = getattr(module, "registry", None)
    if isinstance(named, TaskRegistry):
        return named
    if len(registries) == 1:
        return registries[0]
    raise UsageError(
        f"--app: module {module_name!r} has {len(registries)} TaskRegistry objects; "
        "name one as MODULE:ATTR"
    )
