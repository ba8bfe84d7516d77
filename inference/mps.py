"""An MPS control daemon for the serving process and its codec process (CUDA's Multi-Process Service).

Why: with ``--codec-process`` the codec runs in a second process, so a second CUDA context on the
same GPU. Without MPS the GPU time-slices between contexts and their kernels never overlap: on the
H200 the engine bench at c=64 lost 12 % against the codec thread (2,567 vs 2,904 frames/s). Under MPS
both processes' kernels share the GPU as one context would: 3,399 vs 2,790 frames/s side by side
(+22 %), and served c=64 reached 3,219 frames/s at 96 % NVML busy
(benchmarks/inference_h200/2026-12-03d). An inference pod holds its GPU alone, so the pod can run
the daemon itself: no node-wide MPS set-up, nothing of the GPU's settings changed, and the daemon
goes when the server does.

The daemon must answer before this process creates its CUDA context: :func:`start` runs before the
model loads and exports the pipe directory (in the process environment), which the codec process inherits.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ttsfleet.contracts.serving import MPS_MODES
from ttsfleet.errors import UserError
from ttsfleet.switches import ProcessSwitch, off_or_count, one_of

log = logging.getLogger("ttsfleet.inference.mps")

CONTROL = "nvidia-cuda-mps-control"

#: The share of the GPU's threads (so of its SMs) the codec process may take under MPS, in percent
#: (``off``: all of them, as before). Why: under MPS the codec's kernels run beside the decode
#: step's and take SMs from it; the codec's pushes are small (~35 frames a push at c=64), so they
#: are short of work for a whole GPU anyway, while the step's weight reads want every SM's share of
#: the memory bandwidth. A limit keeps SMs free for the step at some cost in the codec's latency.
#: Unmeasured: ``next_calls.sh 12`` serves it beside the default. A process switch (the server's
#: environment reaches the codec process), read in the codec process before its CUDA context.
CODEC_SM_PERCENT_ENV = "TTSFLEET_CODEC_SM_PERCENT"
CODEC_SM_PERCENT_SWITCH: ProcessSwitch[str | int] = ProcessSwitch(
    CODEC_SM_PERCENT_ENV, "off", off_or_count(CODEC_SM_PERCENT_ENV, 100, "off"))
#: CUDA's own variable: an MPS client's limit on the threads it may use (Volta and later), read when
#: the client creates its CUDA context; it can only lower the daemon's limit.
MPS_THREAD_LIMIT_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"

#: The codec process's scheduling priority among MPS clients: ``normal`` (as before) or
#: ``below-normal`` (CUDA's ``CUDA_MPS_CLIENT_PRIORITY=1``: the GPU schedules the engine's pending
#: work ahead of the codec's). Why: a cap on the codec's SMs (:data:`CODEC_SM_PERCENT_SWITCH`, 40 %)
#: gave the step room, +6.1 % frames/s at c=64, but starved the codec when its pushes grew (first
#: audio p99 234 -> 303 ms at c=64, 331 -> 1,414 ms at c=128; H100, 2026-12-06c call 12); a lower
#: priority keeps every SM open to the codec whenever the step leaves them idle. Unmeasured:
#: ``next_calls.sh 13``. Read in the codec process before its CUDA context, like the thread limit.
CODEC_PRIORITY_ENV = "TTSFLEET_CODEC_MPS_PRIORITY"
CODEC_PRIORITIES = ("normal", "below-normal")
CODEC_PRIORITY_SWITCH: ProcessSwitch[str] = ProcessSwitch(
    CODEC_PRIORITY_ENV, "normal", one_of(CODEC_PRIORITY_ENV, CODEC_PRIORITIES, "normal"))
#: CUDA's own variable (NVIDIA's MPS guide, "CUDA_MPS_CLIENT_PRIORITY"): 0 normal, 1 below normal;
#: a driver that does not know it ignores it, which the served A/B would show as no change.
MPS_PRIORITY_ENV = "CUDA_MPS_CLIENT_PRIORITY"


def limit_codec_client(device: str, environ: dict[str, str] | None = None) -> int | None:
    """In the codec process, before its first CUDA call: set CUDA's MPS thread limit from
    :data:`CODEC_SM_PERCENT_SWITCH` when the codec runs on CUDA under an MPS daemon (the pipe
    directory set by :func:`start`). Returns the percent applied, or None (off, the CPU, no MPS:
    without a daemon CUDA ignores the variable, so it is not set)."""
    env = os.environ if environ is None else environ
    percent = CODEC_SM_PERCENT_SWITCH.get()
    if percent == "off" or not _mps_client(device, env):
        return None
    env[MPS_THREAD_LIMIT_ENV] = str(percent)
    return int(percent)


def lower_codec_priority(device: str, environ: dict[str, str] | None = None) -> bool:
    """In the codec process, before its first CUDA call: set CUDA's MPS client priority from
    :data:`CODEC_PRIORITY_SWITCH` when the codec runs on CUDA under an MPS daemon. Returns whether
    the codec now runs below normal (``normal``, the CPU or no MPS: False, nothing set)."""
    env = os.environ if environ is None else environ
    if CODEC_PRIORITY_SWITCH.get() == "normal" or not _mps_client(device, env):
        return False
    env[MPS_PRIORITY_ENV] = "1"
    return True


def _mps_client(device: str, env: dict[str, str] | os._Environ[str]) -> bool:
    """Whether a process on ``device`` with ``env`` becomes an MPS client: CUDA, and a daemon's pipe
    directory set (by :func:`start`); elsewhere CUDA ignores the client variables, so none is set."""
    return device.startswith("cuda") and bool(env.get("CUDA_MPS_PIPE_DIRECTORY"))


def codec_client_note(device: str) -> str:
    """Apply both codec-client settings (:func:`limit_codec_client`, :func:`lower_codec_priority`)
    and say what took effect, for the codec process's ready line (empty: neither)."""
    percent, lowered = limit_codec_client(device), lower_codec_priority(device)
    parts = ([f"MPS threads {percent} %"] if percent is not None else []) + \
        (["MPS priority below normal"] if lowered else [])
    return "".join(f", {part}" for part in parts)


@dataclass
class MpsDaemon:
    """A daemon this process started (``owned``) or found answering on the same pipe directory."""

    control: str
    pipe_dir: Path
    log_dir: Path
    owned: bool

    def env(self) -> dict[str, str]:
        return {"CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir), "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir)}

    def stop(self) -> None:
        """Tell a daemon this process started to quit, without waiting for it.

        Why not wait: this process is itself an MPS client until it exits, and the daemon's ``quit``
        answers only once its last client is gone — waiting here timed out (10 s) at every server
        stop on the H200 (2026-12-04). The control client is left to finish on its own as this
        process's CUDA context goes away.
        """
        if not self.owned:
            return
        try:
            quitter = subprocess.Popen([self.control], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL, text=True, start_new_session=True,
                                       env={**os.environ, **self.env()})
            quitter.communicate("quit\n", timeout=2)
        except subprocess.TimeoutExpired:
            log.info("MPS: daemon asked to quit; it stops when this process's CUDA context is gone")
        except OSError as exc:
            log.warning("MPS daemon could not be asked to quit: %s", exc)


def check_mode(mode: str, where: str) -> str:
    """``mode`` normalised (one of MPS_MODES), or a UserError naming ``where`` it came from."""
    norm = mode.strip().lower()
    if norm not in MPS_MODES:
        raise UserError(f"mps mode {mode!r} ({where}) is not {', '.join(MPS_MODES)}")
    return norm


def wanted(mode: str, codec_process: bool, device: str) -> bool:
    """Whether to run under MPS (``mode`` checked): only a codec process on CUDA gains from it."""
    return mode != "off" and codec_process and device != "cpu"


@contextmanager
def serving_under_mps(mode: str, codec_process: bool, device: str) -> Iterator[MpsDaemon | None]:
    """The daemon (:func:`start`) for the length of a run where :func:`wanted`, stopped after it."""
    daemon = start(mode) if wanted(mode, codec_process, device) else None
    try:
        yield daemon
    finally:
        if daemon is not None:
            daemon.stop()


def start(mode: str, control: str = CONTROL) -> MpsDaemon | None:
    """Make this process and its children clients of an MPS daemon: the node's where one is set up
    (``CUDA_MPS_PIPE_DIRECTORY`` already set, e.g. by the NVIDIA device plugin's MPS sharing),
    else one started here in a private directory. ``auto`` without the control binary or when the
    daemon does not start: a warning and None (the codec process then time-slices with the
    engine); ``on``: a :class:`UserError`."""
    given = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "")
    if given:
        log.info("MPS: joining the daemon at %s", given)
        return MpsDaemon(control, Path(given), Path(os.environ.get("CUDA_MPS_LOG_DIRECTORY", given)),
                         owned=False)
    exe = shutil.which(control)
    if exe is None:
        if mode == "on":
            raise UserError(f"--mps on: {control} is not on PATH (the NVIDIA container toolkit mounts it "
                            "with the utility capability)")
        log.warning("%s not found: the codec process shares the GPU by time-slicing (slower than the "
                    "codec thread on the H200; --mps off silences this)", control)
        return None
    base = Path(tempfile.mkdtemp(prefix="ttsfleet-mps-"))
    daemon = MpsDaemon(exe, base / "pipe", base / "log", owned=True)
    daemon.pipe_dir.mkdir()
    daemon.log_dir.mkdir()
    done = subprocess.run([exe, "-d"], env={**os.environ, **daemon.env()}, capture_output=True,
                          text=True, timeout=30, check=False)
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip() or "no output"
        why = f"{control} -d failed ({done.returncode}): {said}"
        if mode == "on":
            raise UserError(why)
        log.warning("%s; the codec process shares the GPU by time-slicing", why)
        return None
    os.environ.update(daemon.env())  # read at CUDA's initialisation, here and in the codec process
    log.info("MPS: control daemon started at %s", daemon.pipe_dir)
    return daemon
