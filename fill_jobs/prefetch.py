"""CPU worker processes that run the item stages ahead of the job, in order, a bounded way ahead.

The heavy per-item work (decoding, resampling, VAD, loudness, fingerprints, FLAC encoding) is a
pure function of the item (:meth:`~ttsfleet.fill_jobs.pipeline.Pipeline.prepare`), so a pool of
forked workers does it while the job's main process admits items in shard order and the batch
stages keep the GPU busy. At most ``depth`` items are in flight or waiting, so memory stays
bounded whatever the speed difference.

The workers must never outlive the job, also when it is SIGKILLed: they inherit the shard lock's
file descriptor, and a worker that lived on would hold the lock against the restart. Each worker
asks the kernel to kill it when its parent dies (``PR_SET_PDEATHSIG``) and ignores the stop
signals: a stop is the main process's decision, which then kills the workers itself.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor

from ttsfleet.fill_jobs.manifest import Entry
from ttsfleet.fill_jobs.pipeline import Pipeline, Prepared
from ttsfleet.fill_jobs.settings import CleaningConfig
from ttsfleet.fill_jobs.stopping import STOP_SIGNALS

_PR_SET_PDEATHSIG = 1
_worker_pipeline: Pipeline | None = None


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def worker_count(config: CleaningConfig) -> int:
    """``workers`` from the config (-1: one per usable CPU but one, for the main process)."""
    return max(1, usable_cpus() - 1) if config.workers < 0 else config.workers


def _die_with_parent(parent: int) -> None:
    with contextlib.suppress(OSError, AttributeError):  # not Linux: best effort
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def _init_worker(parent: int, stages: tuple[str, ...], config: CleaningConfig) -> None:
    global _worker_pipeline
    _die_with_parent(parent)
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    _worker_pipeline = Pipeline(stages, config)


def _prepare(entry: Entry, source: str) -> Prepared:
    assert _worker_pipeline is not None
    return _worker_pipeline.prepare(entry, source)


class Prefetcher:
    """Prepared items in shard order: from ``workers`` processes, or in-process when 0."""

    def __init__(self, stages: tuple[str, ...], config: CleaningConfig, workers: int,
                 local: Pipeline | None = None) -> None:
        self.stages = stages
        self.config = config
        self.workers = workers
        self.depth = config.prefetch_items or 4 * max(workers, 1)
        self.local = local
        self._pool: ProcessPoolExecutor | None = None
        if workers > 0:
            import multiprocessing as mp

            # fork: the workers share the parent's imported modules (and any stage registered
            # at run time); the parent has not started CUDA or torch threads at this point.
            self._pool = ProcessPoolExecutor(workers, mp_context=mp.get_context("fork"),
                                             initializer=_init_worker,
                                             initargs=(os.getpid(), stages, config))
            self._pool.submit(os.getpid).result()  # forks every worker now, not at the first item

    def iterate(self, items: Iterable[tuple[Entry, str]]) -> Iterator[Prepared]:
        """Yield each item prepared, in input order."""
        if self._pool is None:
            assert self.local is not None, "in-process prefetch needs a full pipeline"
            for entry, source in items:
                yield self.local.prepare(entry, source)
            return
        todo = iter(items)
        ahead: deque[Future] = deque()
        while True:
            while len(ahead) < self.depth:
                nxt = next(todo, None)
                if nxt is None:
                    break
                ahead.append(self._pool.submit(_prepare, *nxt))
            if not ahead:
                return
            yield ahead.popleft().result()

    def close(self) -> None:
        """Stop at once: cancel what is queued and kill the workers (their items are redone)."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        # shutdown() drops the pool's references to these: take them first
        procs = list(getattr(pool, "_processes", {}).values())
        manager = getattr(pool, "_executor_manager_thread", None)
        results = getattr(pool, "_result_queue", None)
        pool.shutdown(wait=False, cancel_futures=True)
        for p in procs:
            if p.is_alive():
                p.kill()
        for p in procs:
            p.join(timeout=10)
        # A worker killed while it wrote a result leaves half a message in the result pipe, and
        # the manager thread blocks reading the rest for ever (the interpreter's exit hook then
        # joins it for ever: a chaos-test job hung after SIGTERM, CI 2026-12-02, and again under
        # load once this still read the queue after shutdown() had dropped it). This process
        # holds the pipe's last write end once the workers are dead: closing it gives the reader
        # end of file, which the manager treats as a broken pool and exits.
        writer = getattr(results, "_writer", None)
        if writer is not None:
            with contextlib.suppress(OSError):
                writer.close()
        # Let the executor's manager thread see the dead workers and close its wakeup pipe now:
        # left running, it races the interpreter's exit hook, which then writes to the pipe as
        # it closes ("Bad file descriptor" traceback on an otherwise clean exit).
        if manager is not None:
            manager.join(timeout=10)
