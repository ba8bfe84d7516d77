"""Slurm backend over Slurm's own commands: sbatch, scancel, squeue, sinfo, scontrol (and sacct,
where accounting is on, for the end of a requeued run: :meth:`CliBackend.run_end`).

Uses ``squeue --json`` / ``sinfo --json`` where the installed Slurm has them (21.08+; on 22.05
they ignore ``-t/-p/-j`` filters, so filtering happens here) and ``scontrol -o`` one-line text
otherwise, so it works with any Slurm version. The JSON shapes differ by release (both recorded
from real daemons under ``tests/slurm/fixtures/cli_json/``): 22.05's ``sinfo --json`` lists
``nodes``, 25.11's lists per-partition ``sinfo`` summaries instead, so there the node records
come from ``scontrol show nodes --json`` (same record schema); 25.11's ``squeue --json`` leaves
out finished jobs unless given ``--states=all`` (22.05 accepts the flag and lists them anyway).
Partitions always come from ``scontrol -o show partition`` (no JSON form on 22.05). sbatch reads
the script on stdin; its message is surfaced verbatim when it refuses a job.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Mapping

from ttsfleet.slurm.backend import (
    JobInfo,
    NodeInfo,
    PartitionInfo,
    SlurmError,
    SlurmUnavailable,
    SubmitRejected,
    SubmitRequest,
    gpu_request,
    parse_gres,
)

_UNREACHABLE_HINTS = ("unable to contact slurm controller", "connection refused", "socket timed out",
                      "could not establish", "zero bytes were transmitted", "slurm_load",
                      "unable to establish", "couldn't find the specified plugin", "munge")


def _epoch(value: object) -> float:
    if isinstance(value, dict):  # newer slurmrestd: {"set": true, "number": N}
        value = value.get("number", 0) if value.get("set", True) else 0
    try:
        return float(value or 0)
    except (TypeError, ValueError):
        return 0.0


def _exit_status(value: object) -> tuple[int | None, int | None]:
    """(exit code, signal) from a job record's ``exit_code``.

    squeue --json / slurmrestd v0.0.38 give the raw wait status (``768`` = exit 3, ``9`` =
    killed by signal 9); v0.0.40+ give ``{"return_code": {"number": N}, "signal": {"id":
    {"number": S}}}``.
    """
    if isinstance(value, dict):
        code = _epoch(value.get("return_code"))
        sig = value.get("signal") or {}
        sig = _epoch(sig.get("id") if isinstance(sig, dict) else sig)
        return int(code), (int(sig) or None)
    if value is None or value == "":
        return None, None
    try:
        raw = int(value)
    except (TypeError, ValueError):
        return None, None
    return (raw >> 8) & 0xFF, (raw & 0x7F) or None


def _exit_from_text(value: str | None) -> tuple[int | None, int | None]:
    """``scontrol``'s ``ExitCode=3:0`` (code:signal)."""
    code, _, sig = (value or "").partition(":")
    if not code.isdigit():
        return None, None
    return int(code), (int(sig) if sig.isdigit() and int(sig) else None)


def job_from_json(j: Mapping) -> JobInfo:
    """A job record of ``squeue --json`` / slurmrestd ``/jobs`` (both use the same schema)."""
    per_node, cls = gpu_request(j.get("tres_per_node") or "")
    if not per_node and j.get("gres_detail"):
        gres = parse_gres(",".join(j["gres_detail"]))
        per_node = sum(gres.values())
        cls = next((t for t in gres if t != "gpu"), None)
    state = j.get("job_state") or ""
    if isinstance(state, list):
        state = state[0] if state else ""
    task = j.get("array_task_id")
    if isinstance(task, dict):
        task = task.get("number") if task.get("set") else None
    array_job = j.get("array_job_id")
    if isinstance(array_job, dict):
        array_job = array_job.get("number")
    code, sig = _exit_status(j.get("exit_code"))
    return JobInfo(
        job_id=str(j["job_id"]), name=j.get("name") or "", partition=j.get("partition") or "",
        state=str(state).upper(), gpus=per_node * int(_epoch(j.get("node_count")) or 1), gpu_class=cls,
        nodes=j.get("nodes") or "", restart_count=int(_epoch(j.get("restart_cnt"))),
        preempt_time=_epoch(j.get("preempt_time")), start_time=_epoch(j.get("start_time")),
        end_time=_epoch(j.get("end_time")), submit_time=_epoch(j.get("submit_time")),
        reason=j.get("state_reason") or "", comment=j.get("comment") or "",
        array_job_id=str(array_job) if array_job else None,
        array_task_id=int(task) if task is not None else None, exit_code=code, exit_signal=sig)


def node_from_json(n: Mapping) -> NodeInfo:
    state = n.get("state") or ""
    states = {s.upper() for s in ([state] if isinstance(state, str) else state)}
    states |= {s.upper() for s in n.get("state_flags") or ()}
    used = n.get("gres_used")
    return NodeInfo(name=n["name"], states=frozenset(states), partitions=tuple(n.get("partitions") or ()),
                    gpus=parse_gres(n.get("gres")), gpus_used=parse_gres(used) if used is not None else None)


def jobs_from_json_doc(doc: Mapping) -> list[JobInfo]:
    """The ``jobs`` of a ``squeue --json`` / ``scontrol show job --json`` document (any release)."""
    return [job_from_json(j) for j in doc.get("jobs") or ()]


def nodes_from_json_doc(doc: Mapping) -> list[NodeInfo] | None:
    """The node records of a ``sinfo --json`` (22.05) or ``scontrol show nodes --json`` document.

    ``None`` when the document has no ``nodes`` list: 25.11's ``sinfo --json`` holds ``sinfo``
    summaries (one per partition and node state, nodes only by name), not node records.
    """
    nodes = doc.get("nodes")
    if not isinstance(nodes, list):
        return None
    return [node_from_json(n) for n in nodes]


def parse_scontrol_records(text: str) -> list[dict[str, str]]:
    """``scontrol -o show ...`` output: one record per line of ``Key=Value`` tokens."""
    records = []
    for line in text.splitlines():
        line = line.strip()
        if not line or "=" not in line:
            continue
        rec: dict[str, str] = {}
        last = None
        for tok in line.split(" "):
            if "=" in tok and not tok.startswith("="):
                key, _, val = tok.partition("=")
                rec[key] = val
                last = key
            elif last is not None and tok:  # a value containing spaces
                rec[last] += " " + tok
        records.append(rec)
    return records


def _text_time(value: str | None) -> float:
    """``scontrol``'s local ``2026-12-01T09:25:37`` as epoch seconds (0 for Unknown/None)."""
    import time as _time

    try:
        return _time.mktime(_time.strptime(value or "", "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return 0.0


def _state_head(value: str) -> str:
    return value.split("+", 1)[0].upper()


def job_from_scontrol(r: Mapping[str, str]) -> JobInfo:
    per_node, cls = gpu_request(r.get("TresPerNode", ""))
    task = r.get("ArrayTaskId")
    code, sig = _exit_from_text(r.get("ExitCode"))
    return JobInfo(
        job_id=r["JobId"], name=r.get("JobName", ""), partition=r.get("Partition", ""),
        state=_state_head(r.get("JobState", "")),
        gpus=per_node * int(r.get("NumNodes", "1").split("-")[0] or 1),
        gpu_class=cls, nodes="" if r.get("NodeList") in (None, "(null)") else r["NodeList"],
        restart_count=int(r.get("Restarts", "0") or 0), reason=r.get("Reason", ""),
        start_time=_text_time(r.get("StartTime")), end_time=_text_time(r.get("EndTime")),
        submit_time=_text_time(r.get("SubmitTime")),
        comment="" if r.get("Comment") in (None, "(null)") else r["Comment"],
        array_job_id=r.get("ArrayJobId"),
        array_task_id=int(task) if task and task.isdigit() else None, exit_code=code, exit_signal=sig)


def node_from_scontrol(r: Mapping[str, str]) -> NodeInfo:
    states = frozenset(s.upper() for s in r.get("State", "").split("+") if s)
    return NodeInfo(name=r["NodeName"], states=states,
                    partitions=tuple(p for p in r.get("Partitions", "").split(",") if p),
                    gpus=parse_gres(r.get("Gres")), gpus_used=None)


def partition_from_scontrol(r: Mapping[str, str], expand) -> PartitionInfo:
    grace = r.get("GraceTime", "0")
    return PartitionInfo(name=r["PartitionName"], nodes=tuple(expand(r.get("Nodes", ""))),
                         priority_tier=int(r.get("PriorityTier", "1") or 1),
                         preempt_mode=r.get("PreemptMode", "").upper(),
                         grace_period_s=int(grace) if grace.isdigit() else 0, state=r.get("State", ""))


def run_end_from_sacct(out: str, job_id: str, start_time: float) -> float | None:
    """The End of ``job_id``'s run started at ``start_time`` in ``sacct -P -o JobIDRaw,Start,End``
    output with ``SLURM_TIME_FORMAT=%s`` (``-j`` of an array's id lists its other tasks too)."""
    for line in out.splitlines():
        fields = line.strip().split("|")
        if len(fields) != 3 or fields[0] != job_id:
            continue
        start, end = fields[1], fields[2]
        if start.isdigit() and end.isdigit() and int(start) == int(start_time) and int(end) > 0:
            return float(end)
    return None


class CliBackend:
    """Backend over Slurm's commands. ``conf`` sets ``SLURM_CONF``; ``json=None`` probes for JSON."""

    name = "cli"

    def __init__(self, conf: str | None = None, *, json_output: bool | None = None,
                 timeout_s: float = 30.0) -> None:
        self.conf = conf
        self.timeout_s = timeout_s
        self._json = json_output
        self._sinfo_summaries = False  # sinfo --json gives summaries, not node records (25.11)

    # ---------------------------------------------------------------- plumbing
    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.conf:
            env["SLURM_CONF"] = str(self.conf)
        return env

    def _run(self, args: list[str], stdin: str | None = None, check: bool = True,
             extra_env: Mapping[str, str] | None = None) -> str:
        if shutil.which(args[0]) is None:
            raise SlurmUnavailable(f"{args[0]} not found: Slurm client commands are not installed")
        env = self._env() | dict(extra_env or {})
        try:
            proc = subprocess.run(args, input=stdin, capture_output=True, text=True, env=env,
                                  timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            raise SlurmUnavailable(f"{args[0]} timed out after {self.timeout_s:.0f} s") from None
        if check and proc.returncode != 0:
            msg = " ".join((proc.stderr or proc.stdout).split()) or f"exit code {proc.returncode}"
            if any(h in msg.lower() for h in _UNREACHABLE_HINTS):
                raise SlurmUnavailable(f"Slurm unreachable ({args[0]}): {msg}")
            raise SlurmError(f"{args[0]} failed: {msg}")
        return proc.stdout

    @property
    def uses_json(self) -> bool:
        if self._json is None:
            try:
                json.loads(self._run(["sinfo", "--json"]))
                self._json = True
            except (json.JSONDecodeError, SlurmError) as exc:
                if isinstance(exc, SlurmUnavailable):
                    raise
                self._json = False
        return self._json

    # ---------------------------------------------------------------- interface
    def ping(self) -> None:
        out = self._run(["scontrol", "ping"], check=False)
        if "UP" not in out:
            raise SlurmUnavailable(f"Slurm controller not responding: {' '.join(out.split()) or 'no answer'}")

    def submit(self, request: SubmitRequest) -> str:
        args = ["sbatch", "--parsable", f"--job-name={request.name}", f"--partition={request.partition}",
                f"--cpus-per-task={request.cpus_per_task}"]
        if request.gres:
            args.append(f"--gres={request.gres}")
        if request.mem_mb:
            args.append(f"--mem={request.mem_mb}M")
        args.append("--requeue" if request.requeue else "--no-requeue")
        if request.signal:
            args.append(f"--signal={request.signal}")
        if request.open_mode_append:
            args.append("--open-mode=append")
        if request.output:
            args.append(f"--output={request.output}")
        if request.array:
            args.append(f"--array={request.array}")
        if request.workdir:
            args.append(f"--chdir={request.workdir}")
        if request.comment:
            args.append(f"--comment={request.comment}")
        if request.time_limit_min:
            args.append(f"--time={request.time_limit_min}")
        if request.environment:
            bad = [k for k, v in request.environment.items() if "," in v]
            if bad:
                raise SubmitRejected(f"environment values may not contain ',' for sbatch --export: {bad}")
            args.append("--export=ALL," + ",".join(f"{k}={v}" for k, v in request.environment.items()))
        try:
            out = self._run(args, stdin=request.script)
        except SlurmUnavailable:
            raise
        except SlurmError as exc:
            raise SubmitRejected(f"sbatch rejected job {request.name!r}: "
                                 f"{str(exc).removeprefix('sbatch failed: ')}") from None
        job_id = out.strip().split(";")[0]
        if not job_id.isdigit():
            raise SubmitRejected(f"sbatch gave no job id: {out.strip()!r}")
        return job_id

    def cancel(self, job_id: str, signal: str | None = None, batch_only: bool = False) -> None:
        args = ["scancel"]
        if signal:
            args.append(f"--signal={signal}")
        if batch_only:
            args.append("--batch")
        self._run([*args, str(job_id)])

    def jobs(self) -> list[JobInfo]:
        if self.uses_json:  # finished jobs too: the agent needs a failed shard's last job
            return jobs_from_json_doc(json.loads(self._run(["squeue", "--json", "--states=all"])))
        out = self._run(["scontrol", "-o", "show", "job"])
        return [job_from_scontrol(r) for r in parse_scontrol_records(out) if "JobId" in r]

    def nodes(self) -> list[NodeInfo]:
        if self.uses_json:
            if not self._sinfo_summaries:
                found = nodes_from_json_doc(json.loads(self._run(["sinfo", "--json"])))
                if found is not None:
                    return found
                self._sinfo_summaries = True  # 25.11-style sinfo: ask scontrol from now on
            found = nodes_from_json_doc(json.loads(self._run(["scontrol", "show", "nodes", "--json"])))
            if found is not None:
                return found
            raise SlurmError("scontrol show nodes --json listed no 'nodes'")
        out = self._run(["scontrol", "-o", "show", "node"])
        return [node_from_scontrol(r) for r in parse_scontrol_records(out) if "NodeName" in r]

    def partitions(self) -> list[PartitionInfo]:
        out = self._run(["scontrol", "-o", "show", "partition"])
        return [partition_from_scontrol(r, self._expand) for r in parse_scontrol_records(out)
                if "PartitionName" in r]

    def run_end(self, job_id: str, start_time: float) -> float | None:
        """End of the job's run that started at ``start_time``, from sacct's per-run rows (-D).

        None while the accounting has no ended row for that run; SlurmError without accounting.
        Used by the exporter for a requeued run, whose end the job record no longer holds.
        """
        out = self._run(["sacct", "-X", "-D", "-n", "-P", "-j", str(job_id), "-o", "JobIDRaw,Start,End"],
                        extra_env={"SLURM_TIME_FORMAT": "%s"})  # epoch seconds, no time zone
        return run_end_from_sacct(out, str(job_id), start_time)

    def _expand(self, hostlist: str) -> list[str]:
        if not hostlist or hostlist == "(null)":
            return []
        from ttsfleet.slurm.conf import expand_hostlist

        return expand_hostlist(hostlist)
