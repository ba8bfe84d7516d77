"""Slurm backend over slurmrestd (OpenAPI v0.0.38, Slurm 22.05+) with httpx.

For the agent or exporter running off-cluster. ``url`` is ``unix:/path/to/slurmrestd.sock``
(``rest_auth/local``: the socket's peer user is the Slurm user) or ``http(s)://host:port`` with a
JWT (``auth/jwt``: ``X-SLURM-USER-NAME`` / ``X-SLURM-USER-TOKEN``). slurmrestd reports failures in
an ``errors`` list next to an HTTP status; both are surfaced as Slurm's own message.

Known 22.05 quirk: the ``signal`` submit field rejects the ``B:`` prefix, so ``B:USR1@30`` is sent
as ``USR1@30``; slurmrestd then signals the batch shell anyway (it has no job steps).
"""

from __future__ import annotations

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

API = "v0.0.38"


class RestBackend:
    """Backend over slurmrestd. ``url``: ``unix:/socket`` or ``http://host:port``."""

    name = "rest"

    def __init__(self, url: str, *, user: str | None = None, token: str | None = None,
                 timeout_s: float = 15.0, api_version: str = API) -> None:
        self.url = url
        self.api = api_version
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
        if not any(str(p.get("ping", "")).upper() == "UP" for p in pings):
            raise SlurmUnavailable(f"Slurm controller not responding via {self.url}")

    def submit(self, request: SubmitRequest) -> str:
        job: dict[str, Any] = {
            "name": request.name, "partition": request.partition,
            "cpus_per_task": request.cpus_per_task, "requeue": request.requeue,
            "current_working_directory": request.workdir or "/tmp",
            "environment": {"PATH": "/usr/local/bin:/usr/bin:/bin", **request.environment},
        }
        if request.gres:
            job["gres"] = request.gres
        if request.mem_mb:
            job["memory_per_node"] = request.mem_mb
        if request.signal:
            job["signal"] = request.signal.removeprefix("B:")
        if request.open_mode_append:
            job["open_mode"] = "append"
        if request.output:
            job["standard_output"] = request.output
            job["standard_error"] = request.output
        if request.array:
            job["array"] = request.array
        if request.comment:
            job["comment"] = request.comment
        if request.time_limit_min:
            job["time_limit"] = request.time_limit_min
        try:
            body = self._call("POST", "/job/submit", json={"script": request.script, "job": job},
                              error=SubmitRejected)
        except SubmitRejected as exc:
            raise SubmitRejected(f"slurmrestd rejected job {request.name!r}: {exc}") from None
        job_id = body.get("job_id")
        if not job_id:
            raise SubmitRejected(f"slurmrestd gave no job id for {request.name!r}")
        return str(job_id)

    def cancel(self, job_id: str, signal: str | None = None, batch_only: bool = False) -> None:
        # v0.0.38 has no batch flag; a signal to a batch job without steps reaches the batch shell.
        params = {"signal": signal.removeprefix("SIG")} if signal else None
        self._call("DELETE", f"/job/{job_id}", params=params)

    def jobs(self) -> list[JobInfo]:
        return [job_from_json(j) for j in self._call("GET", "/jobs").get("jobs", [])]

    def nodes(self) -> list[NodeInfo]:
        return [node_from_json(n) for n in self._call("GET", "/nodes").get("nodes", [])]

    def partitions(self) -> list[PartitionInfo]:
        out = []
        for p in self._call("GET", "/partitions").get("partitions", []):
            mode = p.get("preemption_mode") or []
            mode = ",".join(mode) if isinstance(mode, list) else str(mode)
            mode = "OFF" if mode.upper() == "DISABLED" else mode  # scontrol spells it OFF
            grace = p.get("preemption_grace_time") or 0
            out.append(PartitionInfo(name=p["name"], nodes=tuple(expand_hostlist(p.get("nodes") or "")),
                                     priority_tier=int(p.get("priority_tier") or 1),
                                     preempt_mode=mode.upper(), grace_time_s=int(grace),
                                     state=str(p.get("state") or "").upper()))
        return out
