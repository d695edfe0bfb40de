"""`named_update`: `@workflow.update(name=...)` for async handlers, typed like the bare form.

Handler names are constants beside each workflow's models, so a decorator names its
handler explicitly. temporalio (1.35) types `update(name=...)` with the handler's own
return type, which for an `async def` handler is a coroutine: a client's
`execute_update(Workflow.handler, ...)` would then be typed as returning a coroutine
instead of the handler's result. The bare `@workflow.update` overload unwraps the
awaitable; this does the same for the named form. At run time it is `workflow.update`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import ParamSpec, TypeVar, cast

from temporalio import workflow

P = ParamSpec("P")
R = TypeVar("R")


def named_update(
    name: str,
) -> Callable[[Callable[P, Awaitable[R]]], workflow.UpdateMethodMultiParam[P, R]]:
    """Decorate an async update handler that Temporal knows as `name`."""

    def decorate(fn: Callable[P, Awaitable[R]]) -> workflow.UpdateMethodMultiParam[P, R]:
        return cast("workflow.UpdateMethodMultiParam[P, R]", workflow.update(name=name)(fn))

    return decorate
