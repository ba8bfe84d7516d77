"""Stopping what the operator tests start, in bounded *real* time: a failed test must cost that
test, never the run.

Why this exists: a kube e2e test failed in a CI run and the run then hung for good in the test's
teardown, in ``asyncio.runners._cancel_all_tasks`` (reproduced here once, 2026-12-04, after
pytest-timeout's alarm failed the test's call): pytest-asyncio's runner cancels every task left in
the loop once and waits for all of them without a timeout, and pytest-timeout's one alarm has
already fired, so nothing bounds that wait. One task that does not finish after one cancellation
is enough, and this stack has several ways to be one: kopf shields parts of its own shutdown
(``while not t.done(): with suppress(CancelledError): await shield(t)`` in its watchers; stopping
its "hung" tasks, i.e. every task created after it started, without a timeout), and ``with
suppress(CancelledError): await task`` in a cleanup swallows the *caller's* cancellation too.

So here every wait is bounded, measured by a thread timer on the real clock (``looptime`` may
compress the loop's clock: a loop-time timeout can fire early, or never when the loop idles on
I/O), nothing swallows a cancellation of the caller, and a task that does not finish is named
with the line it waits on (:class:`StuckTask`) instead of being waited for.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import traceback
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

#: A stopped operator / server gets this long (real seconds) to finish on its own...
GRACE_S = 30.0
#: ...then it is cancelled (again every 0.5 s: a task may swallow a cancellation) this long.
CANCEL_S = 10.0


class StuckTask(RuntimeError):
    """A task did not finish within its bound, not even after being cancelled (left running)."""


def task_stack(task: asyncio.Task[Any], limit: int = 40) -> str:
    """Where ``task`` waits, innermost frame last: its coroutine and the chain of coroutines it
    awaits (:meth:`asyncio.Task.print_stack` shows the outermost frame only)."""
    def first(obj: Any, *attrs: str) -> Any:
        return next((v for v in (getattr(obj, a, None) for a in attrs) if v is not None), None)
    frames = []
    obj: Any = task.get_coro()
    while obj is not None and len(frames) < limit:
        frame = first(obj, "cr_frame", "gi_frame", "ag_frame")
        if frame is None:
            break
        frames.append((frame, frame.f_lineno))
        obj = first(obj, "cr_await", "gi_yieldfrom", "ag_await")
    return "".join(traceback.StackSummary.extract(frames).format()).rstrip()


def describe(tasks: Iterable[asyncio.Task[Any]]) -> str:
    """Each task's name and where it waits."""
    return "\n".join(f"- {t!r}\n{task_stack(t)}" for t in tasks)


async def wait_real(tasks: Iterable[asyncio.Future[Any]], timeout_s: float) -> set[asyncio.Future[Any]]:
    """Wait until every one of ``tasks`` is done or ``timeout_s`` real seconds have passed; return
    those still pending. Neither cancels them nor swallows a cancellation of the caller."""
    pending = {t for t in tasks if not t.done()}
    if not pending or timeout_s <= 0:
        return pending
    loop = asyncio.get_running_loop()
    alarm: asyncio.Future[None] = loop.create_future()

    def ring() -> None:
        if not alarm.done():
            alarm.set_result(None)

    def fire() -> None:
        with contextlib.suppress(RuntimeError):  # the loop was closed meanwhile
            loop.call_soon_threadsafe(ring)

    timer = threading.Timer(timeout_s, fire)
    timer.daemon = True
    timer.start()
    try:
        while pending and not alarm.done():
            await asyncio.wait(pending | {alarm}, return_when=asyncio.FIRST_COMPLETED)
            pending = {t for t in pending if not t.done()}
    finally:
        timer.cancel()
        alarm.cancel()
    return pending


async def stop_task(task: asyncio.Task[Any], what: str, *, grace_s: float | None = None,
                    cancel_s: float | None = None) -> Any:
    """Let ``task`` finish on its own within ``grace_s`` real seconds (whatever asked it to stop
    has done so), then cancel it, again every 0.5 s, for at most ``cancel_s`` more (defaults:
    :data:`GRACE_S`, :data:`CANCEL_S`).

    Returns its result (``None`` when it ended cancelled) or raises its exception; raises
    :class:`StuckTask`, naming ``what`` and where it waits, when it is still running."""
    grace_s = GRACE_S if grace_s is None else grace_s
    cancel_s = CANCEL_S if cancel_s is None else cancel_s
    await wait_real([task], grace_s)
    deadline = time.monotonic() + cancel_s
    while not task.done() and time.monotonic() < deadline:
        task.cancel()
        await wait_real([task], min(0.5, deadline - time.monotonic()))
    if not task.done():
        raise StuckTask(f"{what} did not finish within {grace_s:g} s, nor within {cancel_s:g} s of "
                        f"being cancelled (it is left running); it waits at:\n{task_stack(task)}")
    if task.cancelled():
        return None
    return task.result()


async def run_bounded(aw: Callable[[], Awaitable[Any]], what: str, *, timeout_s: float | None = None,
                      cancel_s: float | None = None) -> Any:
    """``await aw()`` in a task of its own, bounded like :func:`stop_task`: a cleanup that swallows
    a cancellation (``suppress(CancelledError)`` around an ``await``) swallows its own task's,
    never the caller's."""
    async def call() -> Any:
        return await aw()
    return await stop_task(asyncio.create_task(call(), name=what), what, grace_s=timeout_s,
                           cancel_s=cancel_s)


def note(failing: BaseException | None, problem: BaseException) -> None:
    """A cleanup ``problem``: raised when the block succeeded; when it already failed
    (``failing``), a note on that error instead, which stays the test's failure."""
    if failing is None:
        raise problem
    failing.add_note(f"while cleaning up after it: {type(problem).__name__}: {problem}")


class LoopWatchdog:
    """Bounds a synchronous phase (a test's teardown) that runs an event loop: after ``limit_s``
    real seconds, and again every ``again_s`` while still armed, the loop's pending tasks are
    recorded and the loop is stopped, so ``run_until_complete`` (pytest-asyncio's
    ``_cancel_all_tasks`` among them) raises ``RuntimeError('Event loop stopped before Future
    completed.')`` instead of waiting for a task that never finishes. ``report`` says what was
    pending the first time; ``on_fire(report)`` is called in the loop when it fires."""

    def __init__(self, loop: asyncio.AbstractEventLoop, limit_s: float, again_s: float = 10.0,
                 on_fire: Callable[[str], None] | None = None) -> None:
        self.loop, self.limit_s, self.again_s, self.on_fire = loop, limit_s, again_s, on_fire
        self.report: str | None = None
        self.fired = 0
        self._over = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="teardown watchdog", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        delay = self.limit_s
        while not self._over.wait(delay):
            delay = self.again_s
            if self.loop.is_closed() or not self.loop.is_running():
                continue  # blocked outside the loop: nothing this can stop
            with contextlib.suppress(RuntimeError):  # closed in between
                self.loop.call_soon_threadsafe(self._stop_loop)

    def _stop_loop(self) -> None:  # in the loop
        if self._over.is_set():
            return  # disarmed while this callback was queued: the phase is over
        self.fired += 1
        if self.report is None:
            pending = [t for t in asyncio.all_tasks(self.loop) if not t.done()]
            self.report = (f"still running after {self.limit_s:g} s, so its event loop was stopped; "
                           f"{len(pending)} task(s) pending:\n{describe(pending)}")
            if self.on_fire is not None:
                self.on_fire(self.report)
        self.loop.stop()

    def disarm(self) -> None:
        self._over.set()
        self._thread.join(timeout=1.0)
