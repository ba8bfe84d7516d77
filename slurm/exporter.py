"""Prometheus exporter for Slurm GPU use, named by the shared metric contract.

Each :meth:`SlurmExporter.poll` reads jobs and nodes once and sets:

* ``ttsfleet_slurm_gpus_allocated{partition,gpu_class}``: GPUs of running jobs;
* ``ttsfleet_slurm_gpus_idle{gpu_class}``: GPUs on available nodes that no job holds;
* ``ttsfleet_slurm_jobs_pending|running{partition}``;
* ``ttsfleet_slurm_requeues_total{partition}``: restart-count increments seen (a job first seen
  with restarts counts them all);
* ``ttsfleet_slurm_preemptions_total{partition}``: runs that ended preempted: seen with a
  preemption time or in state PREEMPTED, or requeued from a preemptable partition (without
  slurmdbd that is the only trace left: Slurm sets ``preempt_time`` only during the grace time and
  the requeued job is PENDING again within a second);
* ``ttsfleet_slurm_fill_gpu_seconds_total{partition,gpu_class}``: GPU-seconds held by fill jobs,
  run by run, counted the way sacct counts them (allocated GPUs x the run's Elapsed, integer
  seconds from Slurm's own start/end times): live runs accrue at each poll up to the second the
  poll began (a job seen running then ran at least that long), and an ended run's tail is added
  up to its end as Slurm records it. Summing the allocation gauge over poll intervals drifts from
  sacct by the sampling error; this does not (a run that starts and ends between two polls is
  missed). See :meth:`SlurmExporter._count_gpu_seconds` for where a requeued run's end comes from;
* ``ttsfleet_gpus{gpu_class,workload}`` (training | fill | idle) and ``ttsfleet_gpus_total``, the
  fleet-wide view the operator and the simulator export too;
* ``ttsfleet_slurm_up``: 1 when the poll succeeded.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest
from ttsfleet.slurm.backend import JobInfo, SlurmBackend, SlurmError, SlurmUnavailable, node_classes
from ttsfleet.slurm.observe import job_class

from ttsfleet.metrics import make_collectors

#: How long (s) an ended run whose end the controller no longer holds waits for its accounting
#: record (slurmdbd writes it asynchronously) before the submit-time upper bound is taken instead.
ACCOUNTING_WAIT_S = 60


@dataclass
class _Run:
    """One run (start to end or requeue) of a fill job, as far as it has been counted."""

    restart_count: int
    gpus: int
    gpu_class: str
    start: int  # Slurm's start time of the run, integer epoch seconds
    counted_until: int  # integer epoch seconds


@dataclass
class _UnsettledRun:
    """A requeued run seen ended only after Slurm reset the job record (start and end times 0)."""

    job_id: str
    partition: str
    run: _Run
    fallback_end: int  # the submit time Slurm set when the requeue finished: at or after the end
    missed_at: int  # poll second the run was found ended


class SlurmExporter:
    """Turns backend state into the contract's Slurm metrics in its own registry."""

    def __init__(self, backend: SlurmBackend, *, fill_partition: str = "fill",
                 registry: CollectorRegistry | None = None) -> None:
        self.backend = backend
        self.fill_partition = fill_partition
        # "core" holds the fleet-wide gpus / gpus_active / gpus_total gauges
        self.collectors = make_collectors(["slurm", "core"], registry)
        self._restarts: dict[str, int] = {}  # job id -> restart count last seen
        self._preempted_runs: dict[str, set[int]] = {}  # job id -> runs counted as preempted
        self._fill_runs: dict[str, _Run] = {}  # job id -> its current run, for GPU-seconds
        self._unsettled: dict[tuple[str, int], _UnsettledRun] = {}  # (job id, run start) -> run
        self.clock = time.time

    @property
    def registry(self) -> CollectorRegistry:
        return self.collectors.registry

    def poll(self) -> bool:
        """Read Slurm once and update every metric. Returns False (slurm_up 0) when Slurm failed."""
        c = self.collectors
        # before Slurm is read: a job the reads show running was running at this second
        now = math.floor(self.clock())
        try:
            self.backend.ping()
            jobs = self.backend.jobs()
            nodes = self.backend.nodes()
            preemptable = {p.name for p in self.backend.partitions() if p.preempt_mode not in ("", "OFF")}
        except SlurmError:
            c["slurm_up"].set(0)
            return False
        by_node = node_classes(nodes)
        total: Counter[str] = Counter()
        for n in nodes:
            if n.available:
                for cls, count in n.gpus.items():
                    total[cls] += count
        default = next(iter(total)) if len(total) == 1 else None
        allocated: Counter[tuple[str, str]] = Counter()
        pending: Counter[str] = Counter()
        running: Counter[str] = Counter()
        # Create every partition's counters at 0 before any event, so that increase() and rate()
        # see the first preemption as a step from 0 instead of a series that is born at 1.
        for p in sorted({p for n in nodes for p in n.partitions}):
            c["slurm_preemptions"].labels(partition=p)
            c["slurm_requeues"].labels(partition=p)
        for job in jobs:
            if job.active:
                running[job.partition] += 1
                cls = job_class(job, by_node, default)
                if job.gpus and cls:
                    allocated[(job.partition, cls)] += job.gpus
            elif job.waiting:
                pending[job.partition] += 1
            self._count_transitions(job, job.partition in preemptable)
            if job.partition == self.fill_partition:
                self._count_gpu_seconds(job, job_class(job, by_node, default), now)
        for gone in set(self._fill_runs) - {j.job_id for j in jobs}:
            del self._fill_runs[gone]  # left the queue unseen: its tail cannot be known
        self._settle_unsettled(now)
        for cls in total:  # born at 0, so that increase() sees the first GPU-second
            c["slurm_fill_gpu_seconds"].labels(partition=self.fill_partition, gpu_class=cls)
        for name in ("slurm_gpus_allocated", "slurm_gpus_idle", "slurm_jobs_pending",
                     "slurm_jobs_running", "gpus", "gpus_active", "gpus_total"):
            c[name].clear()
        partitions = {p for n in nodes for p in n.partitions} | set(running) | set(pending)
        for p in sorted(partitions):
            c["slurm_jobs_pending"].labels(partition=p).set(pending[p])
            c["slurm_jobs_running"].labels(partition=p).set(running[p])
        for (p, cls), n in sorted(allocated.items()):
            c["slurm_gpus_allocated"].labels(partition=p, gpu_class=cls).set(n)
        for cls in sorted(total):
            used = sum(n for (_, k), n in allocated.items() if k == cls)
            fill = sum(n for (p, k), n in allocated.items() if k == cls and p == self.fill_partition)
            idle = max(total[cls] - used, 0)
            c["slurm_gpus_idle"].labels(gpu_class=cls).set(idle)
            c["gpus_total"].labels(gpu_class=cls).set(total[cls])
            c["gpus"].labels(gpu_class=cls, workload="fill").set(fill)
            c["gpus"].labels(gpu_class=cls, workload="training").set(used - fill)
            c["gpus"].labels(gpu_class=cls, workload="idle").set(idle)
            c["gpus"].labels(gpu_class=cls, workload="inference").set(0)
            c["gpus_active"].labels(gpu_class=cls, workload="fill").set(fill)
            c["gpus_active"].labels(gpu_class=cls, workload="training").set(used - fill)
        c["slurm_up"].set(1)
        return True

    def _count_transitions(self, job: JobInfo, preemptable: bool) -> None:
        c = self.collectors
        runs = self._preempted_runs.setdefault(job.job_id, set())
        if (job.preempt_time > 0 or job.state == "PREEMPTED") and job.restart_count not in runs:
            runs.add(job.restart_count)
            c["slurm_preemptions"].labels(partition=job.partition).inc()
        before = self._restarts.get(job.job_id, 0)
        if job.restart_count > before:
            c["slurm_requeues"].labels(partition=job.partition).inc(job.restart_count - before)
            for run in range(before, job.restart_count):
                if preemptable and run not in runs:
                    runs.add(run)
                    c["slurm_preemptions"].labels(partition=job.partition).inc()
            self._restarts[job.job_id] = job.restart_count

    def _count_gpu_seconds(self, job: JobInfo, cls: str | None, now: int) -> None:
        """Accrue a live fill run up to ``now``; add an ended run's tail up to its recorded end.

        Where a run's end comes from (Slurm 22.05, squeue / scontrol / slurmrestd alike): when a
        run ends, slurmctld sets ``end_time`` to that second, and that is the End (and Elapsed)
        sacct records for it, the run's REQUEUED row included. The job record keeps it while the
        job is COMPLETING (for a requeue by exit code or ``scontrol requeue``/preemption alike,
        the latter with the restart count already raised) and once it is finished. When a
        requeue completes (all epilogs done, ``batch_requeue_fini``), Slurm zeroes
        ``start_time`` and ``end_time`` and sets ``submit_time`` to *that* second, which trails
        the run's end by the epilog and completion latency. A poll that first sees the job
        PENDING again so asks the accounting for the run's End (:meth:`_accounted_end`) and
        takes the reset submit time only where no accounting record can be had.
        """
        counter = self.collectors["slurm_fill_gpu_seconds"]
        run = self._fill_runs.get(job.job_id)
        running = job.active and job.state != "COMPLETING" and job.start_time > 0
        if run is not None and (job.restart_count != run.restart_count or not running):
            del self._fill_runs[job.job_id]
            if int(job.start_time) == run.start and job.end_time > 0:
                # the record still holds this run (finished, or completing after its requeue)
                self._add_tail(job.partition, run, int(job.end_time))
            elif job.restart_count != run.restart_count:
                # requeued and reset: the end is only in the accounting now
                self._unsettled[(job.job_id, run.start)] = _UnsettledRun(
                    job.job_id, job.partition, run, int(job.submit_time), now)
            run = None
        if not running or not job.gpus or not cls:
            return
        if run is None:
            run = _Run(job.restart_count, job.gpus, cls, int(job.start_time), int(job.start_time))
            self._fill_runs[job.job_id] = run
        if now > run.counted_until:
            counter.labels(partition=job.partition, gpu_class=cls).inc(run.gpus * (now - run.counted_until))
            run.counted_until = now

    def _add_tail(self, partition: str, run: _Run, end: int) -> None:
        tail = max(end - run.counted_until, 0) if end > 0 else 0
        self.collectors["slurm_fill_gpu_seconds"].labels(
            partition=partition, gpu_class=run.gpu_class).inc(run.gpus * tail)

    def _settle_unsettled(self, now: int) -> None:
        """Add the tails of requeued runs whose end the job record no longer holds."""
        for key, u in list(self._unsettled.items()):
            end, final = self._accounted_end(u)
            if end is None and not final and now - u.missed_at < ACCOUNTING_WAIT_S:
                continue  # slurmdbd may not have written the run yet: ask again next poll
            # no accounting: the reset submit time, at most the epilog latency after the end
            self._add_tail(u.partition, u.run, end if end is not None else u.fallback_end)
            del self._unsettled[key]

    def _accounted_end(self, u: _UnsettledRun) -> tuple[int | None, bool]:
        """(End of the run as the accounting records it or None, whether asking again is futile).

        Uses the backend's optional ``run_end(job_id, start_time)`` (the CLI backend asks sacct);
        a backend without it, or a cluster without accounting, ends the wait at once.
        """
        run_end = getattr(self.backend, "run_end", None)
        if run_end is None:
            return None, True
        try:
            end = run_end(u.job_id, u.run.start)
        except SlurmUnavailable:
            return None, False
        except SlurmError:  # accounting disabled or refused
            return None, True
        return (int(end), True) if end else (None, False)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
