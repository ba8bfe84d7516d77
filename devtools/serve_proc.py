"""A ``ttsfleet serve`` subprocess for the benchmark scripts: started on a free port, waited for until
``/readyz`` answers 200, stopped with SIGINT (its drain) then killed if it hangs.

Why one helper: the live-route and garbage-collection benchmarks each start servers the same way (the
environment's ``TTSFLEET_*`` switches dropped so flags alone decide, ``-P`` kept where the script runs
under it so the repo root's ``operator/`` cannot shadow the standard library) and must stop with the
server's log tail, not a hang, when one never becomes ready.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from .ports import free_port


def python_cmd() -> list[str]:
    """This interpreter as a command, ``-P`` kept where the caller runs under it (``-P`` here, ``python3
    -m`` on the device), so a child started from the repo root cannot import its ``operator/``."""
    return [sys.executable, *(["-P"] if sys.flags.safe_path else [])]


def wait_ready(proc: subprocess.Popen, url: str, what: str, log: Path | None = None,
               ready_timeout_s: float = 900.0) -> None:
    """Return once ``url``/readyz answers 200; ``SystemExit`` naming ``what`` (with ``log``'s tail, if
    given) when ``proc`` exits first or is not ready in time (then it is killed)."""
    deadline = time.monotonic() + ready_timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"{what} exited" + (f": {log.read_text()[-2000:]}" if log is not None else ""))
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    sys.exit(f"{what} not ready")


def start_serve(flags: list[str], log: Path, log_level: str = "warning",
                ready_timeout_s: float = 900.0) -> tuple[subprocess.Popen, str]:
    """``ttsfleet serve FLAGS`` on 127.0.0.1 and a free port, output to ``log``: the process and its URL
    once ready; ``SystemExit`` with the log's tail if it exits first, or when it is not ready in time."""
    port = free_port()
    cmd = [*python_cmd(), "-m", "ttsfleet.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
           "--log-level", log_level, *flags]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TTSFLEET_")}
    proc = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    wait_ready(proc, url, f"server {flags}", log, ready_timeout_s)
    return proc, url


def stop_serve(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
    """SIGINT (the server drains and exits), then SIGKILL if it is still there after ``grace_s``."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
