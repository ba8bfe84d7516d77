"""The batch stages' own thread: groups of items in, the same groups out with their files added.

A group is ``batchItems`` consecutive items of the shard (cut by shard position, so a restart,
which always resumes at a group boundary, forms exactly the same groups and the batch stages see
exactly the same batches). The job's main thread submits a group as soon as its last item is
admitted and goes on admitting the next; this thread runs the batch stages (codec tokens and
features, on the GPU when there is one) meanwhile, so the GPU works while the CPU workers decode.
At most ``depth`` groups wait, so a slow GPU slows the job instead of filling memory. Once a stop
is requested, groups not yet started are abandoned (redone after the restart), so a stop waits
for at most the group in progress.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from ttsfleet.fill_jobs.pipeline import ItemResult

_DONE = object()
_ABANDONED = object()


class GroupRunner:
    """Runs ``stages`` (built batch-stage objects, in order) on each submitted group."""

    def __init__(self, stages: list[tuple[str, Any]], depth: int = 2,
                 should_stop: Callable[[], bool] = lambda: False) -> None:
        self.stages = stages
        self.should_stop = should_stop
        self._todo: queue.Queue = queue.Queue(maxsize=depth)
        self._done: queue.Queue = queue.Queue()
        self._in_flight = 0
        self.busy_seconds = 0.0  # wall time spent inside the batch stages (this thread)
        self._thread = threading.Thread(target=self._work, name="fill-batch-stages", daemon=True)
        self._thread.start()

    def _work(self) -> None:
        while True:
            group = self._todo.get()
            if group is _DONE:
                return
            if self.should_stop():
                self._done.put(_ABANDONED)
                continue
            try:
                t0 = time.perf_counter()
                for name, stage in self.stages:
                    s0 = time.perf_counter()
                    stage.process(group)
                    secs = (time.perf_counter() - s0) / max(len(group), 1)
                    for r in group:
                        r.stage_seconds[name] = secs
                self.busy_seconds += time.perf_counter() - t0
                self._done.put(group)
            except BaseException as exc:  # handed to the main thread, which fails the job
                self._done.put(exc)

    def submit(self, group: list[ItemResult]) -> None:
        """Queue a group (blocks while ``depth`` groups are waiting)."""
        self._in_flight += 1
        self._todo.put(group)

    def _take(self, block: bool) -> list[ItemResult] | None:
        try:
            got = self._done.get(block=block)
        except queue.Empty:
            return None
        self._in_flight -= 1
        if isinstance(got, BaseException):
            raise got
        if got is _ABANDONED:
            self.abandoned = True
        return got

    abandoned = False  # a group was dropped on stop: every later one is dropped too

    def ready(self) -> Iterator[list[ItemResult]]:
        """Groups finished so far, in submission order (does not wait)."""
        while not self.abandoned and (g := self._take(block=False)) is not None:
            if g is not _ABANDONED:
                yield g

    def drain(self) -> Iterator[list[ItemResult]]:
        """Every submitted group that was (or is being) processed, waiting for it; groups
        abandoned on stop, and all after them, are left out."""
        while self._in_flight:
            g = self._take(block=True)
            if g is not _ABANDONED and not self.abandoned:
                yield g

    def close(self) -> None:
        self._todo.put(_DONE)
        self._thread.join(timeout=60)
