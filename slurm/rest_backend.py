"""Slurm backend over slurmrestd with httpx; the API version is negotiated with the daemon.

For the agent or exporter running off-cluster. ``url`` is ``unix:/path/to/slurmrestd.sock``
(``rest_auth/local``: the socket's peer user is the Slurm user) or ``http(s)://host:port`` with a
JWT (``auth/jwt``: ``X-SLURM-USER-NAME`` / ``X-SLURM-USER-TOKEN``). slurmrestd reports failures in
an ``errors`` list next to an HTTP status; both are surfaced as Slurm's own message.

**Version negotiation.** Unless ``api_version`` is given, the backend reads the daemon's OpenAPI
document (``/openapi/v3``, served by every slurmrestd since 20.11) and uses the newest
``/slurm/vX/`` API it serves that this module speaks (:data:`SUPPORTED`): v0.0.38 on Slurm 22.05,
v0.0.39 on 23.02, v0.0.40 on 23.11, v0.0.41 on 24.05, v0.0.42 on 24.11/25.05, v0.0.43/44 on
25.05/25.11.

**The warning signal.** A fill job must get ``USR1`` in its *batch shell* at preemption (the
wrapper forwards it to the fill job, which checkpoints and exits 99); sbatch spells that
``--signal=B:USR1@<grace>``. Per API version:

* v0.0.38 (22.05): the job description only has ``signal``, parsed by sbatch's option code, which
  honours the ``B:`` (batch) flag only inside the sbatch binary: slurmrestd answers "Invalid
  SIGNAL specification". Without the flag Slurm signals the job's *steps*, never the batch
  shell, so a fill job would see nothing until SIGTERM at the end of GraceTime. So on v0.0.38 the
  backend sends ``signal: "USR1@<grace>"`` and sets ``TTSFLEET_FILL_AS_STEP=1`` in the job's
  environment: the wrapper then runs the fill job as a job step (``srun``), which is what the
  non-batch warning signal reaches.
* v0.0.39+ (data_parser): ``kill_warning_flags: ["BATCH_JOB"]``, ``kill_warning_signal: "USR1"``,
  ``kill_warning_delay`` (an integer on v0.0.39, ``{"set": true, "number": N}`` from v0.0.40), the
  same as ``B:USR1@N``. Other v0.0.39+ spellings: ``environment`` is a list of ``K=V`` strings,
  GPUs go in ``tres_per_node: "gres/gpu:h200:1"``, ``open_mode: ["APPEND"]``, and numbers that can
  be unset (``time_limit``, ``memory_per_node``) are ``{"set", "number"}`` objects from v0.0.40;
  from v0.0.40 the script goes in ``job.script``. Signalling a running job with
  ``DELETE /job/{id}?signal=USR1&flags=BATCH_JOB``.

Only v0.0.38 is exercised against a real daemon in this repository's tests (Debian 12's Slurm
22.05); the v0.0.39+ spellings follow SchedMD's published OpenAPI schemas.
"""

from __future__ import annotations

import re
from typing import Any

import httpx
from ttsfleet.slurm.backend import (
    JobInfo,
    NodeInfo,
    PartitionInfo,
    SlurmError,
    SlurmUnavailable,
    SubmitRejected,
    SubmitRequest,
)
from ttsfleet.slurm.cli_backend import job_from_json, node_from_json
from ttsfleet.slurm.conf import expand_hostlist

#: API versions this module speaks, oldest first.
SUPPORTED = ("v0.0.38", "v0.0.39", "v0.0.40", "v0.0.41", "v0.0.42", "v0.0.43", "v0.0.44")
#: Environment variable telling the fill wrapper to run the fill job as an srun step.
AS_STEP_ENV = "TTSFLEET_FILL_AS_STEP"
_PATH_VERSION = re.compile(r"^/slurm/(v\d+\.\d+\.\d+)/")


def _vkey(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in version.lstrip("v").split("."))


def choose_version(served: set[str]) -> str:
    """The newest served version this module speaks; :class:`SlurmError` if there is none."""
    usable = sorted((v for v in served if v in SUPPORTED), key=_vkey)
    if not usable:
        have = ", ".join(sorted(served, key=_vkey)) or "none"
        raise SlurmError(f"slurmrestd serves Slurm API {have}; ttsfleet speaks {SUPPORTED[0]} to "
                         f"{SUPPORTED[-1]} (start slurmrestd with -s openapi/{SUPPORTED[0]} or newer)")
    return usable[-1]


def _number(value: int) -> dict[str, Any]:
    return {"set": True, "infinite": False, "number": int(value)}


def parse_signal(spec: str) -> tuple[str, int, bool]:
    """``[B:]SIG@T`` → (signal name, seconds, batch shell only)."""
    batch = spec.upper().startswith("B:")
    name, _, when = spec[2 if batch else 0:].partition("@")
    return name.upper().removeprefix("SIG"), int(when or 60), batch


def job_description(request: SubmitRequest, api: str) -> dict[str, Any]:
    """The submit body of ``request`` in API ``api``'s spelling (see the module docstring)."""
    legacy = _vkey(api) < (0, 0, 39)
    wrapped = _vkey(api) >= (0, 0, 40)  # {"set", "number"} numbers, job.script
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", **request.environment}
    job: dict[str, Any] = {
        "name": request.name, "partition": request.partition,
        "cpus_per_task": request.cpus_per_task, "requeue": request.requeue,
        "current_working_directory": request.workdir or "/tmp",
    }
    if request.signal:
        sig, delay, batch = parse_signal(request.signal)
        if legacy:
            job["signal"] = f"{sig}@{delay}"
            if batch:
                env[AS_STEP_ENV] = "1"  # the steps are what a non-batch warning signal reaches
        else:
            job["kill_warning_signal"] = sig
            job["kill_warning_delay"] = _number(delay) if wrapped else delay
            if batch:
                job["kill_warning_flags"] = ["BATCH_JOB"]
    job["environment"] = env if legacy else [f"{k}={v}" for k, v in env.items()]
    if request.gres:
        if legacy:
            job["gres"] = request.gres
        else:
            job["tres_per_node"] = "gres/" + request.gres
    if request.mem_mb:
        job["memory_per_node"] = _number(request.mem_mb) if wrapped else request.mem_mb
    if request.open_mode_append:
        job["open_mode"] = "append" if legacy else ["APPEND"]
    if request.output:
        job["standard_output"] = request.output
        job["standard_error"] = request.output
    if request.array:
        job["array"] = request.array
    if request.comment:
        job["comment"] = request.comment
    if request.time_limit_min:
        job["time_limit"] = _number(request.time_limit_min) if wrapped else request.time_limit_min
    if wrapped:
        job["script"] = request.script
        return {"job": job}
    return {"script": request.script, "job": job}


def partition_from_json(p: dict[str, Any]) -> PartitionInfo:
    """A partition record of v0.0.38 (flat) or v0.0.40+ (nested ``nodes``/``priority``/...)."""
    nodes = p.get("nodes") or ""
    if isinstance(nodes, dict):
        nodes = nodes.get("configured") or ""
    preempt = p.get("preemption_mode")
    grace = p.get("preemption_grace_time")
    if isinstance(p.get("preemption"), dict):  # v0.0.40+
        preempt = p["preemption"].get("mode", preempt)
        grace = p["preemption"].get("grace_time", grace)
    if isinstance(grace, dict):
        grace = grace.get("number", 0) if grace.get("set", True) else 0
    mode = ",".join(preempt) if isinstance(preempt, list) else str(preempt or "")
    mode = "OFF" if mode.upper() in ("DISABLED", "") else mode  # scontrol spells it OFF
    tier = p.get("priority_tier")
    if isinstance(p.get("priority"), dict):
        tier = p["priority"].get("tier", tier)
    state = p.get("state")
    if isinstance(p.get("partition"), dict):
        state = p["partition"].get("state", state)
    state = ",".join(state) if isinstance(state, list) else str(state or "")
    return PartitionInfo(name=p["name"], nodes=tuple(expand_hostlist(nodes)),
                         priority_tier=int(tier or 1), preempt_mode=mode.upper(),
                         grace_period_s=int(grace or 0), state=state.upper())


class RestBackend:
    """Backend over slurmrestd. ``url``: ``unix:/socket`` or ``http://host:port``."""

    name = "rest"

    def __init__(self, url: str, *, user: str | None = None, token: str | None = None,
                 timeout_s: float = 15.0, api_version: str | None = None) -> None:
        self.url = url
        self._api = api_version
        headers = {}
        if user and token:
            headers = {"X-SLURM-USER-NAME": user, "X-SLURM-USER-TOKEN": token}
        if url.startswith("unix:"):
            transport = httpx.HTTPTransport(uds=url.removeprefix("unix:"))
            self._client = httpx.Client(transport=transport, base_url="http://slurmrestd",
                                        headers=headers, timeout=timeout_s)
        else:
            self._client = httpx.Client(base_url=url, headers=headers, timeout=timeout_s)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> RestBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- plumbing
    def _get(self, path: str) -> httpx.Response:
        try:
            return self._client.get(path)
        except httpx.TransportError as exc:
            raise SlurmUnavailable(f"slurmrestd unreachable at {self.url}: {exc}") from None

    def served_versions(self) -> set[str]:
        """The ``/slurm/vX/`` API versions the daemon's OpenAPI document lists."""
        resp = self._get("/openapi/v3")
        if resp.status_code in (401, 403):
            raise SlurmUnavailable(f"slurmrestd at {self.url} refused authentication "
                                   f"(HTTP {resp.status_code})")
        try:
            paths = resp.json().get("paths", {}) if resp.status_code < 400 else {}
        except ValueError:
            paths = {}
        served = {m.group(1) for p in paths if (m := _PATH_VERSION.match(p))}
        if not served:  # no OpenAPI document: probe the ping endpoint of each version
            served = {v for v in SUPPORTED if self._get(f"/slurm/{v}/ping").status_code < 400}
        return served

    @property
    def api(self) -> str:
        """The API version in use (negotiated on first use)."""
        if self._api is None:
            self._api = choose_version(self.served_versions())
        return self._api

    def _call(self, method: str, path: str, *, json: Any = None, params: dict | None = None,
              error: type[SlurmError] = SlurmError) -> dict:
        try:
            resp = self._client.request(method, f"/slurm/{self.api}{path}", json=json, params=params)
        except httpx.TransportError as exc:
            raise SlurmUnavailable(f"slurmrestd unreachable at {self.url}: {exc}") from None
        try:
            body = resp.json()
        except ValueError:
            body = {}
        if not isinstance(body, dict):
            body = {}
        errors = [e.get("error") or e.get("description") or str(e) for e in body.get("errors") or ()
                  if isinstance(e, dict)]
        if resp.status_code in (401, 403):
            raise SlurmUnavailable(f"slurmrestd at {self.url} refused authentication "
                                   f"(HTTP {resp.status_code})")
        if resp.status_code >= 400 or errors:
            detail = "; ".join(errors) or resp.text.strip()[:300] or f"HTTP {resp.status_code}"
            raise error(detail)
        return body

    # ---------------------------------------------------------------- interface
    def ping(self) -> None:
        body = self._call("GET", "/ping", error=SlurmUnavailable)
        pings = body.get("pings") or []
        up = [p for p in pings if str(p.get("ping") or p.get("pinged") or "").upper() == "UP"
              or p.get("responding") is True]
        if not up:
            raise SlurmUnavailable(f"Slurm controller not responding via {self.url}")

    def submit(self, request: SubmitRequest) -> str:
        try:
            body = self._call("POST", "/job/submit", json=job_description(request, self.api),
                              error=SubmitRejected)
        except SubmitRejected as exc:
            raise SubmitRejected(f"slurmrestd rejected job {request.name!r}: {exc}") from None
        job_id = body.get("job_id") or (body.get("result") or {}).get("job_id")
        if not job_id:
            raise SubmitRejected(f"slurmrestd gave no job id for {request.name!r}")
        return str(job_id)

    def cancel(self, job_id: str, signal: str | None = None, batch_only: bool = False) -> None:
        params: dict[str, str] = {}
        if signal:
            params["signal"] = signal.removeprefix("SIG")
        # v0.0.38 has no flags; its DELETE signals the whole job, the batch shell included
        if batch_only and _vkey(self.api) >= (0, 0, 40):
            params["flags"] = "BATCH_JOB"
        self._call("DELETE", f"/job/{job_id}", params=params or None)

    def jobs(self) -> list[JobInfo]:
        return [job_from_json(j) for j in self._call("GET", "/jobs").get("jobs", [])]

    def nodes(self) -> list[NodeInfo]:
        return [node_from_json(n) for n in self._call("GET", "/nodes").get("nodes", [])]

    def partitions(self) -> list[PartitionInfo]:
        return [partition_from_json(p) for p in self._call("GET", "/partitions").get("partitions", [])]
