"""Poll until a condition holds: the one waiting helper of the harness, its tests and the demo.

Two flavours with one signature: :func:`wait_for` blocks (Slurm, plain processes),
:func:`wait_for_async` awaits on the running loop's clock (kopf operators; under ``looptime`` the
clock is virtual, so timeouts cost no wall time) and also accepts conditions that return a
coroutine. Both fail with :class:`WaitTimeout` (an ``AssertionError``, so pytest reports it as a
test failure) naming what was awaited.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

#: Exceptions a condition may raise while the object it reads is not there yet.
NOT_YET: tuple[type[BaseException], ...] = (KeyError, ValueError, IndexError, TypeError)


class WaitTimeout(AssertionError):
    """The condition did not hold within the timeout."""


def _failure(cond: object, timeout: float, what: str | None) -> WaitTimeout:
    return WaitTimeout(f"timed out after {timeout:g} s waiting for {what or cond}")


def wait_for(cond: Callable[[], Any], timeout: float = 60.0, what: str | None = None, step: float = 0.25,
             ignore: tuple[type[BaseException], ...] = ()) -> Any:
    """Call ``cond`` every ``step`` s until it returns something truthy, and return that value.

    ``ignore``: exceptions that mean "not yet" (e.g. :data:`NOT_YET`); anything else propagates.
    """
    end = time.monotonic() + timeout
    while True:
        try:
            value = cond()
        except ignore:
            value = None
        if value:
            return value
        if time.monotonic() > end:
            raise _failure(cond, timeout, what)
        time.sleep(step)


async def wait_for_async(cond: Callable[[], Any], timeout: float = 60.0, what: str | None = None,
                         step: float = 0.25, ignore: tuple[type[BaseException], ...] = ()) -> Any:
    """:func:`wait_for` on the event loop's clock; a coroutine returned by ``cond`` is awaited."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while True:
        try:
            value = cond()
            if asyncio.iscoroutine(value):
                value = await value
        except ignore:
            value = None
        if value:
            return value
        if loop.time() > end:
            raise _failure(cond, timeout, what)
        await asyncio.sleep(step)
