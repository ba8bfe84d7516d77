"""Slurm backend over pyslurm (the Slurm C API from Python), for sites on Slurm 25.11.

Same interface and records as :mod:`ttsfleet.slurm.cli_backend` and
:mod:`ttsfleet.slurm.rest_backend`; selected with ``--backend pyslurm`` (or
``TTSFLEET_SLURM_BACKEND=pyslurm``). PyPI's pyslurm 25.11.x builds only against Slurm 25.11
headers and refuses other versions ("Slurm version mismatch"), so the import is guarded: where
pyslurm cannot be imported, :class:`PyslurmBackend` raises :class:`SlurmUnavailable` with the
reason, and its tests are skipped. pyslurm reads ``SLURM_CONF`` when it is imported, so a
``conf`` given here is exported before the first import.

The warning signal goes in ``JobSubmitDescription.signal`` as ``{"signal", "time",
"batch_only"}``: pyslurm sets the job's ``warn_flags`` batch bit itself, the equivalent of
``sbatch --signal=B:USR1@<grace>``. A signal to the batch shell alone is
``Job.send_signal(sig, steps="batch")``.
"""

from __future__ import annotations

import os
from typing import Any

from ttsfleet.slurm.backend import (
    JobInfo,
    NodeInfo,
    PartitionInfo,
    SlurmError,
    SlurmUnavailable,
    SubmitRejected,
    SubmitRequest,
    parse_gres,
)
from ttsfleet.slurm.conf import expand_hostlist
from ttsfleet.slurm.rest_backend import parse_signal


def load_pyslurm(conf: str | None = None) -> Any:
    """Import pyslurm (with ``SLURM_CONF`` set first), or raise :class:`SlurmUnavailable`."""
    if conf:
        os.environ["SLURM_CONF"] = str(conf)
    try:
        import pyslurm  # noqa: PLC0415 - optional, imported on demand
    except Exception as exc:  # ImportError, or pyslurm's "Slurm version mismatch" at import
        raise SlurmUnavailable(f"pyslurm cannot be used here ({type(exc).__name__}: {exc}); PyPI's "
                               "pyslurm needs Slurm 25.11: use --backend cli or rest") from None
    return pyslurm


def _gres_text(gres: Any) -> str:
    """pyslurm's GRES dicts ({"gpu:h200": 4} or {"gpu": {"h200": 4}}) as ``gpu:h200:4``."""
    if isinstance(gres, str) or gres is None:
        return gres or ""
    items = []
    for name, value in dict(gres).items():
        if isinstance(value, dict):
            items += [f"{name}:{typ}:{n}" for typ, n in value.items()]
        else:
            count = getattr(value, "count", value)
            items.append(f"{name}:{str(count).split('(')[0]}")
    return ",".join(items)


def job_from_pyslurm(job: Any) -> JobInfo:
    gpus = dict(getattr(job, "gpus", None) or {})
    total = sum(int(getattr(g, "count", 0) or 0) for g in gpus.values())
    cls = next((g.type for g in gpus.values() if getattr(g, "type", None)), None)
    task = getattr(job, "array_task_id", None)
    array = getattr(job, "array_id", None)
    return JobInfo(
        job_id=str(job.id), name=job.name or "", partition=job.partition or "",
        state=str(job.state or "").upper(), gpus=total, gpu_class=cls,
        nodes=getattr(job, "allocated_nodes", None) or "",
        restart_count=int(getattr(job, "requeue_count", 0) or 0),
        preempt_time=float(getattr(job, "preempt_time", 0) or 0),
        start_time=float(job.start_time or 0), end_time=float(getattr(job, "end_time", 0) or 0),
        submit_time=float(getattr(job, "submit_time", 0) or 0), reason=job.state_reason or "",
        comment=job.comment or "", array_job_id=str(array) if array else None,
        array_task_id=int(task) if task is not None else None,
        exit_code=getattr(job, "exit_code", None), exit_signal=getattr(job, "exit_code_signal", None) or None)


def node_from_pyslurm(node: Any) -> NodeInfo:
    states = {str(s).upper() for s in str(node.state or "").replace("+", ",").split(",") if s}
    used = getattr(node, "allocated_gres", None)
    return NodeInfo(name=node.name, states=frozenset(states), partitions=tuple(node.partitions or ()),
                    gpus=parse_gres(_gres_text(node.configured_gres)),
                    gpus_used=parse_gres(_gres_text(used)) if used is not None else None)


def partition_from_pyslurm(p: Any) -> PartitionInfo:
    mode = str(p.preempt_mode or "OFF").upper()
    return PartitionInfo(name=p.name, nodes=tuple(expand_hostlist(p.nodes or "")),
                         priority_tier=int(p.priority_tier or 1),
                         preempt_mode="OFF" if mode in ("", "DISABLED") else mode,
                         grace_time_s=int(p.preemption_grace_time or 0), state=str(p.state or "").upper())


class PyslurmBackend:
    """Backend over pyslurm. ``conf``: the slurm.conf pyslurm should read (else ``SLURM_CONF``)."""

    name = "pyslurm"

    def __init__(self, conf: str | None = None) -> None:
        self._ps = load_pyslurm(conf)

    def _rpc(self, what: str, fn, *args, error: type[SlurmError] = SlurmError, **kw):
        try:
            return fn(*args, **kw)
        except self._ps.RPCError as exc:
            msg = str(exc)
            if any(h in msg.lower() for h in ("unable to contact", "connection refused", "timed out")):
                raise SlurmUnavailable(f"Slurm unreachable ({what}): {msg}") from None
            raise error(f"{what}: {msg}") from None

    def ping(self) -> None:
        pings = self._rpc("ping", self._ps.slurmctld.ping_all, error=SlurmUnavailable)
        if not any(getattr(p, "is_responding", False) for p in pings):
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
            desc["signal"] = {"signal": f"SIG{sig}", "time": delay, "batch_only": batch}
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

    def cancel(self, job_id: str, signal: str | None = None, batch_only: bool = False) -> None:
        job = self._ps.Job(int(str(job_id).split("_")[0]))
        if signal is None:
            self._rpc(f"cancel {job_id}", job.cancel)
            return
        name = signal if signal.upper().startswith("SIG") or signal.isdigit() else f"SIG{signal.upper()}"
        self._rpc(f"signal {job_id}", job.send_signal, name, steps="batch" if batch_only else "children")

    def jobs(self) -> list[JobInfo]:
        return [job_from_pyslurm(j) for j in self._rpc("load jobs", self._ps.Jobs.load).values()]

    def nodes(self) -> list[NodeInfo]:
        return [node_from_pyslurm(n) for n in self._rpc("load nodes", self._ps.Nodes.load).values()]

    def partitions(self) -> list[PartitionInfo]:
        loaded = self._rpc("load partitions", self._ps.Partitions.load)
        return [partition_from_pyslurm(p) for p in loaded.values()]
