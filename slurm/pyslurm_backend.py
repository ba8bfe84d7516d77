"""Slurm backend over pyslurm (the Slurm C API from Python), for sites on Slurm 25.11.

Same interface and records as :mod:`ttsfleet.slurm.cli_backend` and
:mod:`ttsfleet.slurm.rest_backend`; selected with ``--backend pyslurm`` (or
``TTSFLEET_SLURM_BACKEND=pyslurm``). PyPI's pyslurm 25.11.x builds only against Slurm 25.11
headers and refuses other versions, so the import is guarded: where pyslurm cannot be imported,
or libslurm finds no usable slurm.conf, :class:`PyslurmBackend` raises :class:`SlurmUnavailable`
with the reason, and its tests are skipped. Checked against a real Slurm 25.11.7 with pyslurm
25.11.2 (slurm/README.md, "pyslurm backend").

The warning signal goes in ``JobSubmitDescription.signal`` as ``{"signal": <number>, "time",
"batch_only"}``: pyslurm sets the job's ``warn_flags`` batch bit itself, the equivalent of
``sbatch --signal=B:USR1@<grace>``. A signal to the batch shell alone is
``Job.send_signal(sig, steps="batch")``.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
from typing import Any

from ttsfleet.slurm.backend import (
    UNTYPED,
    JobInfo,
    NodeInfo,
    PartitionInfo,
    SlurmError,
    SlurmUnavailable,
    SubmitRejected,
    SubmitRequest,
)
from ttsfleet.slurm.conf import expand_hostlist
from ttsfleet.slurm.rest_backend import parse_signal

#: The slurm.conf libslurm was initialised with in this process ("" = its default lookup).
_initialised_conf: list[str] = []


def _probe(conf: str) -> str | None:
    """Import pyslurm with ``conf`` in a child process; the reason it failed, or None.

    libslurm does not raise when it finds no usable slurm.conf: it logs ``fatal: Could not
    establish a configuration source`` and exits the process, so the first import (and every
    re-initialisation with another file) is tried where that exit costs nothing.
    """
    env = {**os.environ, "SLURM_CONF": conf} if conf else dict(os.environ)
    try:
        r = subprocess.run([sys.executable, "-P", "-c", "import pyslurm"], env=env, capture_output=True,
                           text=True, timeout=60, check=False)
    except subprocess.TimeoutExpired:
        return "importing pyslurm took over 60 s"
    if r.returncode == 0:
        return None
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    return lines[-1].strip() if lines else f"exit status {r.returncode}"


def load_pyslurm(conf: str | None = None) -> Any:
    """pyslurm, initialised with ``conf`` (else ``SLURM_CONF``), or raise :class:`SlurmUnavailable`.

    pyslurm initialises libslurm once, at import, from ``SLURM_CONF``; asking for another file
    later re-initialises it (``slurm_fini`` + ``slurm_init``), so the last backend made wins.
    """
    want = str(conf) if conf else os.environ.get("SLURM_CONF", "")
    if _initialised_conf and _initialised_conf[0] == want:
        return sys.modules["pyslurm"]
    if importlib.util.find_spec("pyslurm") is None:
        raise SlurmUnavailable("pyslurm is not installed; PyPI's pyslurm needs Slurm 25.11: "
                               "use --backend cli or rest")
    reason = _probe(want)
    if reason:
        raise SlurmUnavailable(f"pyslurm cannot be used here ({reason}); PyPI's pyslurm needs "
                               "Slurm 25.11 and its slurm.conf: use --backend cli or rest")
    if want:
        os.environ["SLURM_CONF"] = want
    fresh = "pyslurm" not in sys.modules
    try:
        import pyslurm  # noqa: PLC0415 - optional, imported on demand
    except Exception as exc:  # e.g. pyslurm's "Slurm version mismatch" at import
        raise SlurmUnavailable(f"pyslurm cannot be used here ({type(exc).__name__}: {exc}); PyPI's "
                               "pyslurm needs Slurm 25.11: use --backend cli or rest") from None
    if not fresh:
        pyslurm.slurm_fini()
        pyslurm.slurm_init(want or None)
    _initialised_conf[:] = [want]
    return pyslurm


def signal_number(name: str) -> int:
    """``USR1``/``SIGUSR1``/``10`` → 10. pyslurm's signal dict takes only a number (a name fails
    in its u16 conversion with "an integer is required", though its docs show ``"SIGKILL"``)."""
    if name.isdigit():
        return int(name)
    try:
        return int(signal.Signals[f"SIG{name.upper().removeprefix('SIG')}"])
    except KeyError:
        raise SlurmError(f"unknown signal {name!r}") from None


def gpus_of(gres: Any) -> dict[str, int]:
    """GPUs per class in one of pyslurm's GRES/TRES dicts, typed entries preferred.

    The spellings differ by field: ``{"gres/gpu:h200": 2}`` (a job's ``gres_per_node``),
    ``{"gpu:h200": 4}`` (a node's ``configured_gres``), ``{"gpu": 1, "gpu:h200": 1}`` (a node's
    ``allocated_gres``, whose untyped total repeats the typed counts).
    """
    typed: dict[str, int] = {}
    untyped = 0
    for key, value in dict(gres or {}).items():
        name = str(key).removeprefix("gres/").removeprefix("gres:")
        kind, _, cls = name.partition(":")
        if kind != "gpu":
            continue
        count = int(str(getattr(value, "count", value)).split("(")[0] or 0)
        if cls:
            typed[cls] = typed.get(cls, 0) + count
        else:
            untyped += count
    return typed or ({UNTYPED: untyped} if untyped else {})


def _array_task(job: Any) -> int | None:
    """pyslurm maps task id 0 to None (its u32 parse treats 0 as unset); a task record has no
    ``array_tasks_waiting`` (only the array's pending meta record does), so None there means 0."""
    task = job.array_task_id
    if task is None and job.array_id and not job.array_tasks_waiting:
        return 0
    return task


def job_from_pyslurm(job: Any) -> JobInfo:
    """A pyslurm ``Job`` as a :class:`JobInfo`.

    GPUs come from the per-node request (``gres_per_node``): ``job.gpus`` reads the allocated
    TRES, which hold GPUs only where ``AccountingStorageTRES`` tracks ``gres/gpu``. Exit status:
    pyslurm folds an exit status of 128+n into n (``exit 137`` reads as 9, no signal), which the
    job record cannot undo; a script killed by a signal shows the signal.
    """
    gpus = gpus_of(job.gres_per_node)
    array = job.array_id
    task = _array_task(job)
    return JobInfo(
        job_id=str(job.id), name=job.name or "", partition=job.partition or "",
        state=str(job.state or "").upper(), gpus=sum(gpus.values()) * int(job.num_nodes or 1),
        gpu_class=next((c for c in gpus if c != UNTYPED), None), nodes=job.allocated_nodes or "",
        restart_count=int(job.requeue_count or 0), preempt_time=float(job.preempt_time or 0),
        start_time=float(job.start_time or 0), end_time=float(job.end_time or 0),
        submit_time=float(job.submit_time or 0), reason=job.state_reason or "",
        comment=job.comment or "", array_job_id=str(array) if array else None,
        array_task_id=int(task) if task is not None else None,
        exit_code=job.exit_code, exit_signal=job.exit_code_signal or None)


def node_from_pyslurm(node: Any, gpus_tracked: bool) -> NodeInfo:
    """A pyslurm ``Node``. GPUs in use come from its allocated TRES, so only where the controller
    tracks ``gres/gpu`` as a TRES (``gpus_tracked``); otherwise they are unknown (None)."""
    states = {s.upper() for s in str(node.state or "").replace("+", ",").split(",") if s}
    return NodeInfo(name=node.name, states=frozenset(states), partitions=tuple(node.partitions or ()),
                    gpus=gpus_of(node.configured_gres),
                    gpus_used=gpus_of(node.allocated_gres) if gpus_tracked else None)


def partition_from_pyslurm(p: Any) -> PartitionInfo:
    mode = str(p.preempt_mode or "OFF").upper()
    return PartitionInfo(name=p.name, nodes=tuple(expand_hostlist(p.nodes or "")),
                         priority_tier=int(p.priority_tier or 1),
                         preempt_mode="OFF" if mode in ("", "DISABLED") else mode,
                         grace_period_s=int(p.preemption_grace_time or 0), state=str(p.state or "").upper())


class PyslurmBackend:
    """Backend over pyslurm. ``conf``: the slurm.conf pyslurm should read (else ``SLURM_CONF``)."""

    name = "pyslurm"

    def __init__(self, conf: str | None = None) -> None:
        self._ps = load_pyslurm(conf)
        self._gpus_tracked: bool | None = None

    def _rpc(self, what: str, fn, *args, error: type[SlurmError] = SlurmError, **kw):
        try:
            return fn(*args, **kw)
        except self._ps.RPCError as exc:
            msg = str(exc)
            if any(h in msg.lower() for h in ("unable to contact", "connection refused", "timed out")):
                raise SlurmUnavailable(f"Slurm unreachable ({what}): {msg}") from None
            raise error(f"{what}: {msg}") from None

    def ping(self) -> None:
        try:  # ping_all raises on the first controller that does not answer
            pings = self._ps.slurmctld.ping_all()
        except self._ps.RPCError as exc:
            raise SlurmUnavailable(f"Slurm controller not responding (pyslurm: {exc})") from None
        if not any(p.is_responding for p in pings):
            raise SlurmUnavailable("Slurm controller not responding (pyslurm)")

    def submit(self, request: SubmitRequest) -> str:
        desc: dict[str, Any] = {
            "name": request.name, "partitions": request.partition, "script": request.script,
            "cpus_per_task": request.cpus_per_task, "is_requeueable": request.requeue,
            "working_directory": request.workdir or "/tmp",
            "environment": {"PATH": "/usr/local/bin:/usr/bin:/bin", **request.environment},
        }
        if request.gres:
            desc["gres_per_node"] = request.gres
        if request.mem_mb:
            desc["memory_per_node"] = request.mem_mb
        if request.signal:
            sig, delay, batch = parse_signal(request.signal)
            desc["signal"] = {"signal": signal_number(sig), "time": delay, "batch_only": batch}
        if request.open_mode_append:
            desc["log_files_open_mode"] = "append"
        if request.output:
            desc["standard_output"] = desc["standard_error"] = request.output
        for key, value in (("array", request.array), ("comment", request.comment),
                           ("time_limit", request.time_limit_min)):
            if value:
                desc[key] = value
        job_id = self._rpc(f"submit {request.name!r}", self._ps.JobSubmitDescription(**desc).submit,
                           error=SubmitRejected)
        return str(job_id)

    def _job_id(self, job_id: str) -> int:
        """The numeric id of ``job_id``; an array task ``A_T`` resolves to its own job id
        (``Job(A)`` would signal the whole array)."""
        array, _, task = str(job_id).partition("_")
        if not task:
            return int(array)
        for j in self.jobs():
            if j.array_job_id == array and str(j.array_task_id) == task:
                return int(j.job_id)
        raise SlurmError(f"no array task {job_id}")

    def cancel(self, job_id: str, signal: str | None = None, batch_only: bool = False) -> None:
        job = self._ps.Job(self._job_id(job_id))
        if signal is None:
            self._rpc(f"cancel {job_id}", job.cancel)
            return
        self._rpc(f"signal {job_id}", job.send_signal, signal_number(signal),
                  steps="batch" if batch_only else "children")

    def jobs(self) -> list[JobInfo]:
        return [job_from_pyslurm(j) for j in self._rpc("load jobs", self._ps.Jobs.load).values()]

    def nodes(self) -> list[NodeInfo]:
        if self._gpus_tracked is None:
            config = self._rpc("load config", self._ps.slurmctld.Config.load)
            self._gpus_tracked = any(t.startswith("gres/gpu") for t in config.accounting_storage_tres or ())
        loaded = self._rpc("load nodes", self._ps.Nodes.load)
        return [node_from_pyslurm(n, self._gpus_tracked) for n in loaded.values()]

    def partitions(self) -> list[PartitionInfo]:
        loaded = self._rpc("load partitions", self._ps.Partitions.load)
        return [partition_from_pyslurm(p) for p in loaded.values()]
