"""Durable workflows (docs/workflows.md): tasks whose steps run once, recorded as they go.

The public face: :meth:`TaskContext.step <durablesched.TaskContext.step>` and
:meth:`TaskContext.astep <durablesched.TaskContext.astep>` are where a task calls
steps; :func:`step` makes a function a named step with its own retry policy, called
as ``charge(ctx, order_id, amount)``.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar, overload

from durablesched.errors import CheckpointRefused, WorkflowChanged
from durablesched.records import StepRecord
from durablesched.retry import RetryPolicy
from durablesched.workflows.steps import StepEffect

if TYPE_CHECKING:
    from durablesched.context import TaskContext

P = ParamSpec("P")
R = TypeVar("R")


class Step(Generic[P, R]):
    """A function made a workflow step by :func:`step`: ``s(ctx, *args)`` is
    ``ctx.step(s.name, s.fn, *args, retry=s.retry, effect=s.effect)``; ``s.fn`` is the
    plain function (a direct call of it records nothing)."""

    def __init__(
        self,
        fn: Callable[P, R],
        name: str,
        retry: RetryPolicy | None,
        effect: StepEffect | None,
    ) -> None:
        self.fn = fn
        self.name = name
        self.retry = retry
        self.effect = effect
        functools.update_wrapper(self, fn)

    def __call__(self, ctx: TaskContext, /, *args: P.args, **kwargs: P.kwargs) -> R:
        call = functools.partial(self.fn, *args, **kwargs) if kwargs else self.fn
        result: R = ctx.step(
            self.name, call, *(() if kwargs else args), retry=self.retry, effect=self.effect
        )
        return result


class AsyncStep(Generic[P, R]):
    """:class:`Step` for an ``async def`` function: ``await s(ctx, *args)``."""

    def __init__(
        self,
        fn: Callable[P, Coroutine[Any, Any, R]],
        name: str,
        retry: RetryPolicy | None,
        effect: StepEffect | None,
    ) -> None:
        self.fn = fn
        self.name = name
        self.retry = retry
        self.effect = effect
        functools.update_wrapper(self, fn)

    async def __call__(self, ctx: TaskContext, /, *args: P.args, **kwargs: P.kwargs) -> R:
        call = functools.partial(self.fn, *args, **kwargs) if kwargs else self.fn
        result: R = await ctx.astep(
            self.name, call, *(() if kwargs else args), retry=self.retry, effect=self.effect
        )
        return result


class StepMaker:
    """What ``@step(name=..., retry=..., effect=...)`` gives: it makes the step."""

    def __init__(
        self, name: str | None, retry: RetryPolicy | None, effect: StepEffect | None
    ) -> None:
        self.name = name
        self.retry = retry
        self.effect = effect

    @overload
    def __call__(  # type: ignore[overload-overlap]
        self, fn: Callable[P, Coroutine[Any, Any, R]], /
    ) -> AsyncStep[P, R]: ...
    @overload
    def __call__(self, fn: Callable[P, R], /) -> Step[P, R]: ...
    def __call__(self, fn: Callable[..., Any], /) -> Step[Any, Any] | AsyncStep[Any, Any]:
        name = self.name if self.name is not None else f"{fn.__module__}.{fn.__qualname__}"
        if inspect.iscoroutinefunction(fn):
            return AsyncStep(fn, name, self.retry, self.effect)
        return Step(fn, name, self.retry, self.effect)


@overload
def step(fn: Callable[P, Coroutine[Any, Any, R]], /) -> AsyncStep[P, R]: ...  # type: ignore[overload-overlap]
@overload
def step(fn: Callable[P, R], /) -> Step[P, R]: ...
@overload
def step(
    *, name: str | None = None, retry: RetryPolicy | None = None, effect: StepEffect | None = None
) -> StepMaker: ...
def step(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    retry: RetryPolicy | None = None,
    effect: StepEffect | None = None,
) -> Any:
    """Make ``fn`` a workflow step named ``name`` (default: the function's module and
    qualified name), with its own retry policy and database effect: ``@step``, or
    ``@step(name="charge", retry=RetryPolicy(max_attempts=3))``.

    Name steps explicitly in code that lives long: the name is what replay checks at
    each position, and a moved or renamed function would change it."""
    maker = StepMaker(name, retry, effect)
    return maker if fn is None else maker(fn)


__all__ = [
    "AsyncStep",
    "CheckpointRefused",
    "Step",
    "StepEffect",
    "StepMaker",
    "StepRecord",
    "WorkflowChanged",
    "step",
]
