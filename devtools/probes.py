"""Container probes and lifecycle hooks, run the kubelet's way against a local process.

A probe (``httpGet``, ``tcpSocket`` or ``exec``) is tried every ``periodSeconds`` after
``initialDelaySeconds``, each try bounded by ``timeoutSeconds``; ``successThreshold``
consecutive successes make the result True, ``failureThreshold`` consecutive failures make it
False (:class:`ProbeState`). ``httpGet`` succeeds on 200-399 from the pod's address (or the
probe's ``host``) and the port, named or numbered; ``exec`` on exit 0. ``grpc`` is not
supported (a failure with that reason). Defaults are Kubernetes': period 10 s, timeout 1 s,
success 1, failure 3.

Hooks (``preStop``, ``postStart``): ``exec``, ``httpGet`` and ``sleep``, bounded by the time
left in the grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from ttsfleet.devtools.podspec import Mount, host_path, port_number


@dataclass(frozen=True)
class ProbeTiming:
    initial_delay_s: float = 0.0
    period_s: float = 10.0
    timeout_s: float = 1.0
    success_threshold: int = 1
    failure_threshold: int = 3

    @classmethod
    def of(cls, probe: Mapping[str, Any]) -> ProbeTiming:
        return cls(float(probe.get("initialDelaySeconds", 0)), float(probe.get("periodSeconds", 10)),
                   float(probe.get("timeoutSeconds", 1)), int(probe.get("successThreshold", 1)),
                   int(probe.get("failureThreshold", 3)))


@dataclass
class ProbeState:
    """Consecutive results folded into the probe's verdict (None until it has one)."""

    timing: ProbeTiming
    result: bool | None = None
    successes: int = 0
    failures: int = 0
    message: str = ""

    def record(self, ok: bool, message: str = "") -> bool:
        """Fold one try in; True when the verdict changed."""
        before = self.result
        self.message = message
        if ok:
            self.successes, self.failures = self.successes + 1, 0
            if self.successes >= self.timing.success_threshold:
                self.result = True
        else:
            self.failures, self.successes = self.failures + 1, 0
            if self.failures >= self.timing.failure_threshold:
                self.result = False
        return self.result != before


@dataclass
class Target:
    """Where a probe or hook of one container goes: its address, spec, env and mounts."""

    ip: str
    container: Mapping[str, Any]
    env: Mapping[str, str]
    cwd: Path
    mounts: Sequence[Mount] = field(default_factory=tuple)


async def _http(action: Mapping[str, Any], target: Target, timeout: float) -> tuple[bool, str]:
    port = port_number(target.container, action.get("port", 80))
    scheme = str(action.get("scheme", "HTTP")).lower()
    host = action.get("host") or target.ip
    headers = {h["name"]: h["value"] for h in action.get("httpHeaders") or []}
    url = f"{scheme}://{host}:{port}{action.get('path', '/')}"
    try:
        async with httpx.AsyncClient(verify=False, timeout=timeout) as client:  # noqa: S501 - a probe
            resp = await client.get(url, headers=headers)
    except httpx.HTTPError as exc:
        return False, f"GET {url}: {type(exc).__name__}"
    return 200 <= resp.status_code < 400, f"GET {url}: HTTP {resp.status_code}"


async def _tcp(action: Mapping[str, Any], target: Target, timeout: float) -> tuple[bool, str]:
    port = port_number(target.container, action.get("port", 0))
    host = action.get("host") or target.ip
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    except (OSError, TimeoutError) as exc:
        return False, f"tcp {host}:{port}: {type(exc).__name__}"
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True, f"tcp {host}:{port}: open"


async def run_exec(command: Sequence[str], target: Target, timeout: float) -> tuple[bool, str]:
    """A command in the container's environment; the whole process group is killed at the timeout."""
    argv = [host_path(str(a), target.mounts) for a in command]
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, env=dict(target.env), cwd=target.cwd, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL, start_new_session=True)
    except OSError as exc:
        return False, f"exec {argv[0]}: {exc.strerror}"
    try:
        code = await asyncio.wait_for(proc.wait(), max(timeout, 0.0))
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
        return False, f"exec {argv[0]}: timed out after {timeout:g} s"
    return code == 0, f"exec {argv[0]}: exit {code}"


async def probe_once(probe: Mapping[str, Any], target: Target) -> tuple[bool, str]:
    """One try of a probe: (success, what happened)."""
    timeout = ProbeTiming.of(probe).timeout_s
    if "httpGet" in probe:
        return await _http(probe["httpGet"], target, timeout)
    if "tcpSocket" in probe:
        return await _tcp(probe["tcpSocket"], target, timeout)
    if "exec" in probe:
        return await run_exec(probe["exec"].get("command") or [], target, timeout)
    return False, f"probe {sorted(probe)} is not supported by this kubelet"


async def run_hook(hook: Mapping[str, Any], target: Target, budget_s: float) -> str:
    """A lifecycle hook within ``budget_s`` seconds; returns what happened (hooks never fail a stop)."""
    if budget_s <= 0:
        return "no time left in the grace period"
    if "sleep" in hook:
        seconds = min(float(hook["sleep"].get("seconds", 0)), budget_s)
        await asyncio.sleep(seconds)
        return f"slept {seconds:g} s"
    if "exec" in hook:
        return (await run_exec(hook["exec"].get("command") or [], target, budget_s))[1]
    if "httpGet" in hook:
        return (await _http(hook["httpGet"], target, budget_s))[1]
    return f"hook {sorted(hook)} is not supported by this kubelet"
