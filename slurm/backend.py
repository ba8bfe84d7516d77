"""The Slurm backend interface: what the fill agent and the exporter need from a cluster.

Two implementations carry it out: :mod:`ttsfleet.slurm.cli_backend` (Slurm's own commands, any
version) and :mod:`ttsfleet.slurm.rest_backend` (slurmrestd over httpx, for running off-cluster).
Both return the plain records below, so everything above them is backend-agnostic, and both
pass the same conformance tests. GPU classes are GRES types (``gpu:h200:4``).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from ttsfleet.errors import UserError

PENDING = "PENDING"
RUNNING = "RUNNING"
#: States in which a job holds its allocation.
ACTIVE_STATES = frozenset({RUNNING, "COMPLETING", "SUSPENDED", "CONFIGURING", "STOPPED", "SIGNALING"})
#: States in which a job waits for resources (incl. a requeued job's wait).
WAITING_STATES = frozenset({PENDING, "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESIZING"})
#: Node states whose GPUs cannot take work.
UNAVAILABLE_NODE_STATES = frozenset({"DOWN", "DRAIN", "DRAINED", "DRAINING", "FAIL", "FAILING",
                                     "FUTURE", "MAINT", "NOT_RESPONDING", "POWERED_DOWN",
                                     "POWERING_DOWN", "REBOOT_ISSUED", "UNKNOWN", "INVALID_REG",
                                     "PLANNED", "RESERVED"})


class SlurmError(UserError):
    """Slurm answered with an error (the message is Slurm's own)."""


class SlurmUnavailable(SlurmError):
    """Slurm could not be reached (no controller, no socket, commands missing)."""


class SubmitRejected(SlurmError):
    """sbatch / job submit was refused; the message is Slurm's reason."""


@dataclass(frozen=True)
class SubmitRequest:
    """One batch job (or job array) to submit."""

    script: str
    name: str
    partition: str
    gres: str | None = None  # e.g. "gpu:h200:1"
    cpus_per_task: int = 1
    mem_mb: int | None = None
    requeue: bool = True
    signal: str | None = None  # e.g. "B:USR1@30"
    open_mode_append: bool = True
    output: str | None = None  # stdout/stderr path pattern (%j, %A, %a)
    array: str | None = None  # e.g. "0-7" or "0-7%2"
    workdir: str | None = None
    comment: str | None = None
    environment: dict[str, str] = field(default_factory=dict)
    time_limit_min: int | None = None


@dataclass(frozen=True)
class JobInfo:
    """A job as squeue / slurmrestd sees it. ``gpus`` counts all nodes of the job."""

    job_id: str
    name: str
    partition: str
    state: str
    gpus: int = 0
    gpu_class: str | None = None
    nodes: str = ""
    restart_count: int = 0
    preempt_time: float = 0.0
    start_time: float = 0.0
    end_time: float = 0.0  # once ended; while running Slurm reports the time-limit end
    submit_time: float = 0.0  # Slurm resets it to the requeue time when a run is requeued
    reason: str = ""
    comment: str = ""
    array_job_id: str | None = None
    array_task_id: int | None = None
    exit_code: int | None = None  # the batch script's exit status, once it ended
    exit_signal: int | None = None  # the signal that killed it (9: SIGKILL, e.g. the OOM killer)

    @property
    def live(self) -> bool:
        """Holds or waits for an allocation (a requeued job is live: it runs again)."""
        return self.active or self.waiting

    def describe_end(self) -> str:
        """How the job ended, for people: ``FAILED exit 137`` or ``FAILED signal 9``."""
        out = self.state or "gone"
        if self.exit_signal:
            out += f" signal {self.exit_signal}"
        elif self.exit_code is not None:
            out += f" exit {self.exit_code}"
        return out

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES

    @property
    def waiting(self) -> bool:
        return self.state in WAITING_STATES


@dataclass(frozen=True)
class NodeInfo:
    """A node: its state flags and GPUs per class (configured and in use)."""

    name: str
    states: frozenset[str]
    partitions: tuple[str, ...]
    gpus: dict[str, int]
    gpus_used: dict[str, int] | None = None  # None where the backend cannot say

    @property
    def available(self) -> bool:
        return not (self.states & UNAVAILABLE_NODE_STATES)


@dataclass(frozen=True)
class PartitionInfo:
    name: str
    nodes: tuple[str, ...]
    priority_tier: int
    preempt_mode: str
    grace_period_s: int
    state: str


@runtime_checkable
class SlurmBackend(Protocol):
    """Submit, cancel, list jobs, node / partition / GRES state, pending training demand."""

    name: str

    def ping(self) -> None:
        """Return if the controller answers, raise :class:`SlurmUnavailable` otherwise."""

    def submit(self, request: SubmitRequest) -> str:
        """Submit a batch job; return its job id. Raises :class:`SubmitRejected`."""

    def cancel(self, job_id: str, signal: str | None = None, batch_only: bool = False) -> None:
        """Cancel a job, or only send it ``signal`` (to the batch shell with ``batch_only``)."""

    def jobs(self) -> list[JobInfo]:
        """Every job the controller knows (pending, running, recently finished)."""

    def nodes(self) -> list[NodeInfo]: ...

    def partitions(self) -> list[PartitionInfo]: ...


# ---------------------------------------------------------------------------- shared parsing
_GRES_ITEM = re.compile(r"^(?:gres[:/])?gpu(?::(?P<type>[A-Za-z0-9_.-]+))?[:=](?P<count>\d+)")
UNTYPED = "gpu"


def parse_gres(text: str | None) -> dict[str, int]:
    """GPUs per type in a GRES string: ``gpu:h200:4(S:0-1),gpu:rtx5090:2`` → {h200: 4, rtx5090: 2}.

    Also reads TRES spellings (``gres:gpu:h200:1``, ``gres/gpu:h200=1``); an untyped ``gpu:2``
    counts under ``"gpu"``. A count with an index suffix (``gpu:h200:2(IDX:0-1)``) is a use count.
    """
    out: Counter[str] = Counter()
    if not text or text in ("(null)", "N/A"):
        return {}
    for item in re.split(r",(?![^()]*\))", text):
        m = _GRES_ITEM.match(item.strip())
        if m:
            out[m.group("type") or UNTYPED] += int(m.group("count"))
    return dict(out)


def gpu_request(tres_per_node: str | None) -> tuple[int, str | None]:
    """(GPUs per node, class or None) from a job's per-node TRES request."""
    gres = parse_gres(tres_per_node)
    if not gres:
        return 0, None
    typed = [t for t in gres if t != UNTYPED]
    return sum(gres.values()), (typed[0] if typed else None)


def node_classes(nodes: Iterable[NodeInfo]) -> dict[str, str]:
    """Node name → its (first) GPU class, for jobs that asked for untyped GPUs."""
    return {n.name: next(iter(n.gpus)) for n in nodes if n.gpus}


def pending_training_gpus(jobs: Sequence[JobInfo], fill_partition: str,
                          default_class: str | None = None) -> dict[str, int]:
    """GPUs wanted by waiting jobs outside the fill partition, per class (untyped → default)."""
    out: Counter[str] = Counter()
    for j in jobs:
        if j.waiting and j.partition != fill_partition and j.gpus:
            cls = j.gpu_class or default_class
            if cls:
                out[cls] += j.gpus
    return dict(out)
