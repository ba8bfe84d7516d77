"""Slurm state → the policy's view: one :class:`~ttsfleet.policy.ClassObservation` per GPU class.

Pure functions over a :class:`ClusterSnapshot` (jobs + nodes read once from a backend). Only
nodes in the fill partition count. Training GPUs are GPUs allocated to jobs in any other
partition; pending training GPUs are GPUs wanted by waiting jobs outside the fill partition (held
jobs and jobs waiting on a dependency or a begin time do not count); running fill jobs become
:class:`~ttsfleet.policy.FillJobView`s, terminating once Slurm preempted them or the agent
signalled them. Fill jobs waiting in the queue (incl. requeued ones) are reported next to the
observation: Slurm starts them by itself as GPUs free up.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass

from ttsfleet.slurm.backend import JobInfo, NodeInfo, SlurmBackend, node_classes
from ttsfleet.slurm.conf import expand_hostlist

from ttsfleet.policy import ClassObservation, FillJobView

#: Waiting reasons that mean "not waiting for GPUs": such jobs hold no claim on fill's GPUs.
NOT_WAITING_FOR_GPUS = frozenset({"Dependency", "DependencyNeverSatisfied", "JobHeldUser",
                                  "JobHeldAdmin", "BeginTime", "PartitionDown", "PartitionInactive",
                                  "ReqNodeNotAvail", "InvalidAccount", "InvalidQOS",
                                  "AssocGrpGRES", "QOSMaxGRESPerUser", "launch_failed_requeued_held"})
TERMINATING_STATES = frozenset({"COMPLETING", "SIGNALING", "PREEMPTED", "STOPPED"})


@dataclass(frozen=True)
class ClusterSnapshot:
    jobs: tuple[JobInfo, ...]
    nodes: tuple[NodeInfo, ...]
    t: float


def take_snapshot(backend: SlurmBackend, clock: Callable[[], float] = time.time) -> ClusterSnapshot:
    return ClusterSnapshot(tuple(backend.jobs()), tuple(backend.nodes()), clock())


@dataclass(frozen=True)
class ClassState:
    """The policy's observation of one class plus the fill jobs Slurm already has queued for it."""

    observation: ClassObservation
    pending_fill_jobs: int
    fill_jobs: tuple[JobInfo, ...]


def job_class(job: JobInfo, classes_by_node: dict[str, str], default: str | None) -> str | None:
    """A job's GPU class: its GRES type, else the class of its (first) node, else ``default``."""
    if job.gpu_class:
        return job.gpu_class
    if job.nodes:
        for n in expand_hostlist(job.nodes):
            if n in classes_by_node:
                return classes_by_node[n]
    return default


def observe_classes(snapshot: ClusterSnapshot, *, fill_partition: str = "fill",
                    fill_gpus_per_job: int = 1,
                    seconds_since_checkpoint: Callable[[JobInfo], float] | None = None,
                    signalled: Collection[str] = (),
                    fill_work_available: int | None = None) -> dict[str, ClassState]:
    """One :class:`ClassState` per GPU class present on the fill partition's nodes."""
    fill_nodes = [n for n in snapshot.nodes if fill_partition in n.partitions]
    total: Counter[str] = Counter()
    unavailable: Counter[str] = Counter()
    for n in fill_nodes:
        for cls, count in n.gpus.items():
            total[cls] += count
            if not n.available:
                unavailable[cls] += count
    by_node = node_classes(fill_nodes)
    fill_node_names = {n.name for n in fill_nodes}
    default = next(iter(total)) if len(total) == 1 else None
    training: Counter[str] = Counter()
    pending_training: Counter[str] = Counter()
    pending_fill: Counter[str] = Counter()
    fill_jobs: dict[str, list[JobInfo]] = {cls: [] for cls in total}
    for job in snapshot.jobs:
        if not job.gpus:
            continue
        cls = job_class(job, by_node, default)
        if cls not in total:
            continue
        if job.active and job.nodes and not set(expand_hostlist(job.nodes)) & fill_node_names:
            continue  # runs on nodes fill cannot use
        if job.partition == fill_partition:
            if job.active:
                fill_jobs[cls].append(job)
            elif job.waiting:
                pending_fill[cls] += 1
        elif job.active:
            training[cls] += job.gpus
        elif job.waiting and job.reason not in NOT_WAITING_FOR_GPUS:
            pending_training[cls] += job.gpus
    out: dict[str, ClassState] = {}
    for cls in sorted(total):
        views = tuple(
            FillJobView(id=j.job_id, gpus=j.gpus,
                        seconds_since_checkpoint=(seconds_since_checkpoint(j)
                                                  if seconds_since_checkpoint else 0.0),
                        terminating=(j.preempt_time > 0 or j.state in TERMINATING_STATES
                                     or j.job_id in signalled))
            for j in sorted(fill_jobs[cls], key=lambda j: j.job_id))
        obs = ClassObservation(
            gpu_class=cls, t=snapshot.t, total_gpus=total[cls], training_gpus=training[cls],
            pending_training_gpus=pending_training[cls], unavailable_gpus=unavailable[cls],
            fill_jobs=views, fill_gpus_per_job=fill_gpus_per_job,
            fill_work_available=fill_work_available, queued_fill_jobs=pending_fill[cls])
        out[cls] = ClassState(obs, pending_fill[cls], tuple(fill_jobs[cls]))
    return out
