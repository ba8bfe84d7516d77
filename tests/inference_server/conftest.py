"""Fixtures for the inference server tests: real ``ttsfleet serve`` subprocesses on free 127.0.0.1 ports.

Every test talks HTTP to a running server with the embedded ``tiny`` model (deterministic random
weights on CPU), decodes the audio it returns, and leaves no process behind. The main server is
shared by the session (it needs an API key, so auth is exercised on every call); tests that kill
or overload a server start their own.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from ttsfleet.devtools.ports import free_port

API_KEY = "test-key-123"


@pytest.fixture(scope="module")
def parts():  # noqa: ANN201
    """(the tiny model, its codec, its tokenizer) for an in-process engine, once per test module; one
    torch thread, as the CI machine's cores are shared with the servers the other tests start."""
    import torch
    from ttsfleet.inference.codec import load_codec
    from ttsfleet.inference.loader import load_model
    from ttsfleet.inference.tokenizer import load_tokenizer

    torch.set_num_threads(1)
    return load_model("tiny"), load_codec("tiny"), load_tokenizer("tiny")


@pytest.fixture
def separate_prefill_calls() -> Iterator[None]:
    """Mixed steps off (``TTSFLEET_MIXED_STEPS=off``, on by default) for the engines a test makes: for
    the tests of the prefill calls themselves (chunks between steps, coalescing, the side stream),
    whose pieces would otherwise ride in the decode steps wherever something decodes."""
    from ttsfleet.inference.mixed_step import MIXED_STEPS_SWITCH

    MIXED_STEPS_SWITCH.set("off")
    yield
    MIXED_STEPS_SWITCH.reset()


@dataclass
class ServerProc:
    """A ``ttsfleet serve`` subprocess and how to reach it."""

    proc: subprocess.Popen
    port: int
    log_path: Path
    api_key: str | None
    interrupted: bool = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, auth: bool = True, timeout: float = 120.0) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.api_key}"} if auth and self.api_key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def async_client(self, timeout: float = 120.0) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        return httpx.AsyncClient(base_url=self.url, headers=headers, timeout=timeout,
                                 limits=httpx.Limits(max_connections=64))

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        self.interrupt()
        self.wait_stopped()

    def interrupt(self) -> None:
        """SIGINT (the server's orderly stop), once."""
        if self.proc.poll() is None and not self.interrupted:
            self.proc.send_signal(signal.SIGINT)
            self.interrupted = True

    def wait_stopped(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def start_server(log_dir: Path, *args: str, api_key: str | None = None, env: dict[str, str] | None = None,
                 wait_ready: bool = True) -> ServerProc:
    """Start ``python -m ttsfleet.cli serve`` on a free port and wait until /readyz says 200."""
    port = free_port()
    cmd = [sys.executable, "-m", "ttsfleet.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
           "--checkpoint", "tiny", "--device", "cpu", "--log-level", "warning", *args]
    if api_key:
        cmd += ["--api-key", api_key]
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    for var in [v for v in full_env if v.startswith("TTSFLEET_") and v not in (env or {})]:
        del full_env[var]  # the tests decide the configuration
    log_path = log_dir / f"server-{port}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=full_env)
    server = ServerProc(proc, port, log_path, api_key)
    if wait_ready:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}:\n{server.log()}")
            try:
                if httpx.get(f"{server.url}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                server.stop()
                raise RuntimeError(f"server not ready after 90 s:\n{server.log()}")
            time.sleep(0.2)
    return server


@pytest.fixture(scope="session")
def server_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """Start extra servers; all of them are stopped at the end of the session."""
    started: list[ServerProc] = []
    log_dir = tmp_path_factory.mktemp("server-logs")

    def factory(*args: str, **kw) -> ServerProc:
        s = start_server(log_dir, *args, **kw)
        started.append(s)
        return s

    yield factory
    for s in started:  # all at once: each server's orderly stop runs beside the others'
        s.interrupt()
    for s in started:
        s.wait_stopped()


@pytest.fixture(scope="session")
def server(server_factory, tmp_path_factory: pytest.TempPathFactory) -> ServerProc:
    """The shared server: tiny model, 8 slots, an API key and a references directory.

    Prompts are prefilled in chunks of 32 tokens, so every HTTP test also runs chunked prefill.
    """
    refs = tmp_path_factory.mktemp("references")
    return server_factory("--max-running-requests", "8", "--max-queue", "32", "--max-text-chars", "250",
                          "--references-dir", str(refs), "--prefill-chunk-tokens", "32", api_key=API_KEY)


@pytest.fixture()
def port_picker():
    """A free 127.0.0.1 port per call."""
    return free_port


@pytest.fixture()
def client(server: ServerProc) -> Iterator[httpx.Client]:
    with server.client() as c:
        yield c


@pytest.fixture(scope="session")
def sdk_server(server_factory, tmp_path_factory: pytest.TempPathFactory) -> ServerProc:
    """The server the official SDKs talk to on their defaults.

    The SDKs ask for up to 1024 frames per segment; the server's own cap (48 frames) keeps each call
    about a second on the CPU model without touching what the client sends.
    """
    refs = tmp_path_factory.mktemp("sdk-references")
    return server_factory("--max-running-requests", "4", "--max-new-tokens", "48",
                          "--references-dir", str(refs), api_key=API_KEY)


def speech_wav(text: str = "This is a reference voice.", seconds: float = 1.2) -> bytes:
    """Real speech from espeak-ng as WAV bytes; a voiced tone where espeak-ng is not installed."""
    import io
    import shutil

    import numpy as np
    import soundfile as sf

    if shutil.which("espeak-ng"):
        out = subprocess.run(["espeak-ng", "--stdout", text], capture_output=True, timeout=60, check=True)
        return out.stdout
    sr = 22050
    t = np.arange(int(seconds * sr)) / sr
    x = 0.3 * np.sin(2 * np.pi * 160 * t) * (1 + 0.3 * np.sin(2 * np.pi * 3 * t))
    buf = io.BytesIO()
    sf.write(buf, x.astype(np.float32), sr, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def metric_value(client: httpx.Client, name: str, **labels: str) -> float:
    """The current value of one series on ``/metrics`` (0 when it does not exist yet)."""
    from prometheus_client.parser import text_string_to_metric_families

    for fam in text_string_to_metric_families(client.get("/metrics").text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return 0.0


def run_requests(engine, prompt, count: int, max_new_tokens: int | list[int], **request) -> list[str]:  # noqa: ANN001
    """``count`` requests (seeds 0 .. count-1) through a started ``engine`` at once, each read to its
    end: the last event's kind of each ("done" or "error"). ``max_new_tokens``: every request's frame
    limit, or one per request."""
    import asyncio

    from ttsfleet.inference.engine import GenerationRequest
    from ttsfleet.inference.sampling import SamplingParams

    limits = max_new_tokens if isinstance(max_new_tokens, list) else [max_new_tokens] * count
    assert len(limits) == count, f"{len(limits)} frame limits for {count} requests"

    async def one(seed: int) -> str:
        req = GenerationRequest(prompt=prompt, sampling=SamplingParams(seed=seed),
                                max_new_tokens=limits[seed], **request)
        h = engine.submit(req, asyncio.get_running_loop())
        while (ev := await h.next()).kind not in ("done", "error"):
            pass
        return ev.kind

    async def main() -> list[str]:
        return await asyncio.gather(*(one(s) for s in range(count)))

    return asyncio.run(main())


def stream_outputs(engine, prompt, seeds: list[int], max_new_tokens: int, field: str, **request) -> list:  # noqa: ANN001
    """One request per seed through a started ``engine`` at once, each read to "done": the ``field``
    ("codes" or "audio") of its audio events, joined along time (an error event fails the test)."""
    import asyncio

    import numpy as np
    from ttsfleet.inference.engine import GenerationRequest
    from ttsfleet.inference.sampling import SamplingParams

    async def one(seed: int) -> np.ndarray:
        req = GenerationRequest(prompt=prompt, sampling=SamplingParams(seed=seed),
                                max_new_tokens=max_new_tokens, **request)
        h = engine.submit(req, asyncio.get_running_loop())
        parts = []
        while (ev := await h.next()).kind != "done":
            assert ev.kind == "audio", ev.reason
            parts.append(getattr(ev, field))
        return np.concatenate(parts, axis=-1)

    async def main() -> list:
        return await asyncio.gather(*(one(s) for s in seeds))

    return asyncio.run(main())
