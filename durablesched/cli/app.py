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
    A module that cannot be imported (missing, or a syntax error) is a usage
    error naming it; an exception raised by the module's own code is left to
    show its traceback, which is where its bug is.
    """
    module_name, _, attr = spec.partition(":")
    if not module_name or not all(part.isidentifier() for part in module_name.split(".")):
        raise UsageError(f"--app must be MODULE[:ATTR] (a dotted module name), got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except SyntaxError as e:
        where = f"{e.filename}:{e.lineno}" if e.filename else f"line {e.lineno}"
        raise UsageError(f"--app: cannot import module {module_name!r}: {where}: {e.msg}") from None
    except ImportError as e:
        raise UsageError(f"--app: cannot import module {module_name!r} ({e})") from None
    if attr:
        if not hasattr(module, attr):
            raise UsageError(f"--app: module {module_name!r} has no attribute {attr!r}")
        found = getattr(module, attr)
        if not isinstance(found, TaskRegistry):
            raise UsageError(
                f"--app: {module_name}:{attr} is a {type(found).__name__}, "
                "not a durablesched TaskRegistry"
            )
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
