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
  seconds from Slurm's own start/end times): live runs accrue at each poll, and an ended run's
  tail is added from its end time (or, for a requeued run, from the submit time Slurm resets to
  the requeue instant). Summing the allocation gauge over poll intervals drifts from sacct by
  the sampling error; this does not (a run that starts and ends between two polls is missed);
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
from ttsfleet.slurm.backend import JobInfo, SlurmBackend, SlurmError, node_classes
from ttsfleet.slurm.observe import job_class

from ttsfleet.metrics import make_collectors


@dataclass
class _Run:
    """One run (start to end or requeue) of a fill job, as far as it has been counted."""

    restart_count: int
    gpus: int
    gpu_class: str
    counted_until: float  # integer epoch seconds


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
        self.clock = time.time

    @property
    def registry(self) -> CollectorRegistry:
        return self.collectors.registry

    def poll(self) -> bool:
        """Read Slurm once and update every metric. Returns False (slurm_up 0) when Slurm failed."""
        c = self.collectors
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
                self._count_gpu_seconds(job, job_class(job, by_node, default))
        for gone in set(self._fill_runs) - {j.job_id for j in jobs}:
            del self._fill_runs[gone]  # left the queue unseen: its tail cannot be known
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

    def _count_gpu_seconds(self, job: JobInfo, cls: str | None) -> None:
        counter = self.collectors["slurm_fill_gpu_seconds"]
        run = self._fill_runs.get(job.job_id)
        running = job.active and job.state != "COMPLETING" and job.start_time > 0
        if run is not None and (job.restart_count != run.restart_count or not running):
            # the run ended: finished (end_time) or requeued (Slurm set submit_time to that instant)
            end = job.submit_time if job.restart_count != run.restart_count else job.end_time
            tail = max(int(end) - run.counted_until, 0) if end else 0
            counter.labels(partition=job.partition, gpu_class=run.gpu_class).inc(run.gpus * tail)
            del self._fill_runs[job.job_id]
            run = None
        if not running or not job.gpus or not cls:
            return
        if run is None:
            run = _Run(job.restart_count, job.gpus, cls, int(job.start_time))
            self._fill_runs[job.job_id] = run
        now = math.floor(self.clock())
        if now > run.counted_until:
            counter.labels(partition=job.partition, gpu_class=cls).inc(run.gpus * (now - run.counted_until))
            run.counted_until = now

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
