"""Prefetcher.close(): the workers die and this process lets go of the result pipe's write end.

Why the write end: a worker killed while it wrote a result leaves half a message in the pipe, and
the executor's manager thread blocks reading the rest until every write end is closed; the
interpreter's exit hook joins that thread, so a job that kept its own write end open hung after
SIGTERM (two CI runs, 2026-12-02: py-spy of the job left behind). ``ProcessPoolExecutor.shutdown``
drops the pool's reference to the queue, so close() must take it first.
"""

from __future__ import annotations

from ttsfleet.fill_jobs.prefetch import Prefetcher
from ttsfleet.fill_jobs.settings import CleaningConfig


def test_close_kills_the_workers_and_closes_this_processs_write_end() -> None:
    pre = Prefetcher(("decode", "hash"), CleaningConfig(), workers=2)
    pool = pre._pool
    assert pool is not None
    procs = list(pool._processes.values())
    writer = pool._result_queue._writer
    manager = pool._executor_manager_thread
    assert procs and all(p.is_alive() for p in procs) and not writer.closed
    pre.close()
    assert not any(p.is_alive() for p in procs)
    assert writer.closed, "the result pipe's write end is still open here: a half-written result hangs exit"
    assert manager is not None and not manager.is_alive()
    pre.close()  # a second close is a no-op
