"""Fixtures for the Slurm tests: one real local cluster per session, backends, a speech corpus.

The cluster (munged, slurmctld, one slurmd with 4 fake h200 GPUs, slurmrestd when installed,
MariaDB + slurmdbd for sacct when installed)
lives under a pytest temp dir on free ports; its daemons are stopped at session end by a
finalizer and, should the run die, by the cluster's atexit hook. Each test that uses the cluster
starts and ends with an empty queue.

``TTSFLEET_SLURM_PREFIX=/opt/slurm-25.11`` runs the whole session against that Slurm installation
instead (its commands first on ``PATH``): how the pyslurm backend's tests run for real, since
PyPI's pyslurm needs Slurm 25.11 (see slurm/README.md, "pyslurm backend").
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pytest
from ttsfleet.devtools.localcluster import (
    SLURM_PREFIX_ENV,
    LocalCluster,
    LocalClusterSpec,
    missing_binaries,
    restd_supported,
    slurm_path,
)
from ttsfleet.slurm.backend import JobInfo
from ttsfleet.slurm.cli_backend import CliBackend

GRACE_PERIOD_S = 5
KILL_WAIT_S = 2
CRED_EXPIRE_S = 5
#: The local cluster's backfill interval (``SchedulerParameters=bf_interval=2``): how often the
#: backfill scheduler preempts for and starts a pending job.
BF_INTERVAL_S = 2
#: The local cluster's main-scheduler interval (``SchedulerParameters=sched_interval=``): what
#: starts a requeued job once its BeginTime has passed (see :class:`LocalClusterSpec`). As often as
#: the backfill pass: each requeue test waited up to this long after BeginTime (cred_expire is at
#: Slurm's minimum, 5 s, already).
SCHED_INTERVAL_S = 2
#: How long a wait may see nothing change (no job state, no checkpointed item) before it fails.
STALL_S = 60.0
#: The furthest ahead a time Slurm promises (a requeued job's BeginTime) is believed: a job told to
#: wait longer than this is a stall like any other, not a reason to hang the test.
MAX_PROMISE_S = 300.0


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "the local Slurm cluster needs root"
    missing = missing_binaries()
    if missing:
        return f"Slurm/munge not installed (missing {', '.join(missing)})"
    return None


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    restd = not missing_binaries(restd=True) and restd_supported()
    dbd = not missing_binaries(dbd=True)  # accounting (sacct) where slurmdbd + MariaDB are installed
    spec = LocalClusterSpec(nodes=1, cpus_per_node=8, gpus_per_node=4, gpu_class="h200",
                            grace_period_s=GRACE_PERIOD_S, kill_wait_s=KILL_WAIT_S,
                            cred_expire_s=CRED_EXPIRE_S, sched_interval_s=SCHED_INTERVAL_S,
                            restd=restd, dbd=dbd)
    c = LocalCluster(tmp_path_factory.mktemp("slurm-cluster"), spec)
    with pytest.MonkeyPatch.context() as mp:
        if os.environ.get(SLURM_PREFIX_ENV):  # the tests' own Slurm commands come from there too
            mp.setenv("PATH", slurm_path())
        try:
            c.start()
        except Exception:
            c.stop()
            raise
        yield c
        c.stop()


def slurm_version(cluster: LocalCluster) -> str:
    """The cluster's Slurm release (``25.11.7``), from ``scontrol --version``."""
    out = subprocess.run(["scontrol", "--version"], env=cluster.env(), capture_output=True, text=True,
                         check=True).stdout
    return out.split()[-1]


@pytest.fixture
def slurm(cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalCluster]:
    """The session cluster with an empty queue before and after the test; SLURM_CONF set."""
    monkeypatch.setenv("SLURM_CONF", str(cluster.conf_path))
    cluster.cancel_all_jobs()
    yield cluster
    cluster.cancel_all_jobs()


@pytest.fixture
def cli_backend(slurm: LocalCluster) -> CliBackend:
    return CliBackend(str(slurm.conf_path))


def wait_progressing(cond: Callable[[], object], progress: Callable[[], object], what: str,
                     stall_s: float = STALL_S, interval: float = 0.2,
                     explain: Callable[[], str] | None = None,
                     promised: Callable[[], float | None] | None = None) -> object:
    """Poll ``cond`` until truthy; fail only once ``progress()`` has not changed for ``stall_s``.

    The deadline follows the thing waited for: jobs that keep changing state and checkpointing
    items are slow on a loaded machine, not broken; only a wait that sees nothing move fails.
    ``promised`` (say :func:`slurm_promise` over the jobs the last poll saw) is the wall-clock
    time (``time.time()``) until which Slurm itself says nothing will move, a requeued job's
    BeginTime and the scheduler pass after it: the stall clock starts no earlier than the latest
    such time seen, and a promise more than :data:`MAX_PROMISE_S` ahead is not believed.
    ``explain`` (say :meth:`LocalCluster.diagnosis`) adds what a stall needs to be understood
    from the CI log alone: a flake seen once is otherwise seen blind."""
    last, since = progress(), time.monotonic()
    quiet_until = 0.0  # wall clock: the latest moment Slurm said its jobs would wait until
    while True:
        value = cond()
        if value:
            return value
        now = progress()
        if now != last:
            last, since = now, time.monotonic()
        if promised is not None and (t := promised()) is not None and t <= time.time() + MAX_PROMISE_S:
            quiet_until = max(quiet_until, t)
        stalled = time.monotonic() - since
        waiting_on_slurm = quiet_until - time.time()
        if stalled > stall_s and waiting_on_slurm < -stall_s:
            detail = f"\n{explain()}" if explain else ""
            promise = f", Slurm's own wait ended {-waiting_on_slurm:.0f} s ago" if quiet_until else ""
            pytest.fail(f"no progress for {stall_s:.0f} s waiting for {what}{promise} "
                        f"(last seen: {now!r}){detail}")
        time.sleep(interval)


def slurm_promise(jobs: Iterable[JobInfo], sched_interval_s: float = SCHED_INTERVAL_S) -> float | None:
    """Until when Slurm itself says these jobs wait: the latest BeginTime of a pending job, plus one
    main-scheduler pass (``sched_interval``), or None when no job waits for a time.

    A requeued job is pending with reason ``BeginTime`` until requeue + cred_expire + 1 s (Slurm
    reports that time as its StartTime), longer after a failed launch credential (120 s, see
    ``job_scheduler.c``). Once it has passed, nothing in Slurm reacts to it: the backfill scheduler
    runs only after a change, so the main scheduler's next full pass is what starts the job.
    A job pending for any other reason (held, a drained node, resources) promises nothing."""
    times = [j.start_time for j in jobs
             if j.state == "PENDING" and j.reason == "BeginTime" and j.start_time > 0]
    return max(times) + sched_interval_s if times else None


def squeue_truth(cluster: LocalCluster) -> list[dict[str, str]]:
    """Jobs straight from ``squeue`` text output (independent of the backends under test)."""
    out = subprocess.run(["squeue", "-h", "-a", "-t", "all", "-o", "%i|%P|%T|%b|%r"], env=cluster.env(),
                         capture_output=True, text=True, check=True).stdout
    keys = ("id", "partition", "state", "tres", "reason")
    return [dict(zip(keys, line.split("|"), strict=True)) for line in out.splitlines() if line.strip()]


def job_by_id(jobs: list[JobInfo], job_id: str) -> JobInfo | None:
    return next((j for j in jobs if j.job_id == job_id), None)


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 32-item espeak-ng speech manifest (the fill jobs' real input)."""
    if shutil.which("espeak-ng") is None:
        pytest.skip("needs espeak-ng")
    from ttsfleet.fill_jobs.corpus import make_corpus

    return make_corpus(tmp_path_factory.mktemp("corpus"), 32, seed=7)
