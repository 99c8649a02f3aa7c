"""The project's tasks, by module path: the ``@task`` objects of installed apps.

A task's row names its Django module path (``shop.tasks.send_receipt``). A
worker runs a row only if that path is one of the tasks found here, in each
installed app's ``tasks`` module and in the modules ``OPTIONS["task_modules"]``
lists; it never imports whatever a row names. Enqueueing a task that is not
found here is refused, since no worker would ever run it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from importlib import import_module
from typing import Any

from django.apps import apps
from django.tasks import Task
from django.tasks.exceptions import InvalidTask
from django.utils.module_loading import module_has_submodule


class ProjectTasks:
    """The project's tasks, found on first use (apps must be ready) for backend ``alias``."""

    def __init__(self, alias: str, extra_modules: Iterable[str] = ()) -> None:
        self.alias = alias
        self.extra_modules = tuple(extra_modules)
        self._tasks: dict[str, Task[..., Any]] | None = None
        self._lock = threading.Lock()

    def _modules(self) -> Iterator[str]:
        for config in apps.get_app_configs():
            if module_has_submodule(config.module, "tasks"):
                yield f"{config.name}.tasks"
        yield from self.extra_modules

    def _find(self) -> dict[str, Task[..., Any]]:
        found: dict[str, Task[..., Any]] = {}
        for name in self._modules():
            module = import_module(name)
            for value in vars(module).values():
                # Every task, whichever backend it names: `.using(backend=...)` may
                # send any of them here.
                if isinstance(value, Task):
                    found.setdefault(value.module_path, value)
        return found

    @property
    def by_path(self) -> dict[str, Task[..., Any]]:
        with self._lock:
            if self._tasks is None:
                self._tasks = self._find()
            return self._tasks

    def get(self, path: str) -> Task[..., Any] | None:
        return self.by_path.get(path)

    def check(self, task: Task[..., Any]) -> None:
        """InvalidTask unless a worker of this backend would find ``task``."""
        known = self.get(task.module_path)
        if known is None or known.func is not task.func:
            raise InvalidTask(
                f"Task {task.module_path!r} is not in the tasks module of an installed app "
                f"nor in OPTIONS['task_modules'] of backend {self.alias!r}: no worker would "
                "run it"
            )
