"""A pod's status from its containers' processes: phase, container states, Ready, as a kubelet writes it.

Pure: :class:`ContainerRecord` is what the kubelet knows about one container (its process state,
restarts, probe verdicts), :func:`pod_status` turns the records into the ``status`` the API server
stores. The rules, from the kubelet's:

* phase — Pending until a container has started; Running while one runs or will be restarted;
  then Succeeded when every container exited 0, else Failed (a deleted pod ends terminal too);
* a container is ``started`` when its startupProbe passed (at once without one) and ``ready``
  when started, running and its readinessProbe says so (at once without one);
* conditions PodScheduled, Initialized, ContainersReady and Ready (no readiness gates), each
  keeping its ``lastTransitionTime`` until its value changes;
* an exit by signal N reads as exit code 128 + N, as container runtimes report it.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


def now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def exit_code(returncode: int) -> int:
    """A process's return code as the container's exit code (signal N -> 128 + N)."""
    return 128 - returncode if returncode < 0 else returncode


@dataclass
class ContainerRecord:
    name: str
    image: str = ""
    state: str = "waiting"  # waiting | running | terminated
    reason: str = "ContainerCreating"
    message: str = ""
    pid: int | None = None
    started_at: str = ""
    finished_at: str = ""
    exit_code: int | None = None
    restart_count: int = 0
    last_terminated: dict[str, Any] | None = None
    startup_passed: bool = True
    readiness: bool | None = True  # the readinessProbe's verdict (True without one)
    will_restart: bool = False

    @property
    def ready(self) -> bool:
        return self.state == "running" and self.startup_passed and bool(self.readiness)

    def terminated(self) -> dict[str, Any]:
        code = self.exit_code or 0
        return {"exitCode": code, "reason": self.reason or ("Completed" if code == 0 else "Error"),
                "startedAt": self.started_at or self.finished_at, "finishedAt": self.finished_at,
                **({"message": self.message} if self.message else {})}

    def status(self) -> dict[str, Any]:
        if self.state == "running":
            state: dict[str, Any] = {"running": {"startedAt": self.started_at}}
        elif self.state == "terminated":
            state = {"terminated": self.terminated()}
        else:
            waiting = {"reason": self.reason, **({"message": self.message} if self.message else {})}
            state = {"waiting": waiting}
        out = {"name": self.name, "image": self.image, "imageID": "", "ready": self.ready,
               "started": self.state == "running" and self.startup_passed,
               "restartCount": self.restart_count, "state": state,
               "lastState": {"terminated": self.last_terminated} if self.last_terminated else {}}
        if self.pid is not None:
            out["containerID"] = f"process://{self.pid}"
        return out


def phase(records: Sequence[ContainerRecord]) -> str:
    if all(r.state == "waiting" and r.restart_count == 0 and r.last_terminated is None for r in records):
        return "Pending"
    if any(r.state == "running" or r.will_restart or r.state == "waiting" for r in records):
        return "Running"
    return "Succeeded" if all(r.exit_code == 0 for r in records) else "Failed"


def _conditions(previous: Sequence[Mapping[str, Any]], values: Mapping[str, bool],
                now: str) -> list[dict[str, Any]]:
    before = {c["type"]: c for c in previous}
    out = []
    for kind, value in values.items():
        status = "True" if value else "False"
        old = before.get(kind)
        when = old["lastTransitionTime"] if old and old.get("status") == status else now
        out.append({"type": kind, "status": status, "lastTransitionTime": when})
    return out


@dataclass
class PodView:
    """What goes into one status besides the containers."""

    pod_ip: str
    start_time: str = field(default_factory=now_iso)


def pod_status(records: Sequence[ContainerRecord], view: PodView,
               previous: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The pod's ``status`` (without ``message``/``reason`` unless a container could not start)."""
    prev = previous or {}
    ph = phase(records)
    ready = ph == "Running" and all(r.ready for r in records)
    conds = _conditions(prev.get("conditions") or [], {
        "PodScheduled": True, "Initialized": True, "ContainersReady": ready, "Ready": ready}, now_iso())
    status: dict[str, Any] = {"phase": ph, "conditions": conds, "hostIP": "127.0.0.1",
                              "hostIPs": [{"ip": "127.0.0.1"}], "startTime": view.start_time,
                              "containerStatuses": [r.status() for r in records]}
    if view.pod_ip:
        status["podIP"], status["podIPs"] = view.pod_ip, [{"ip": view.pod_ip}]
    return status

