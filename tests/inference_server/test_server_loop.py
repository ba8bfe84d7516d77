"""The server's event loop and HTTP parser (``inference/server_loop.py``): uvloop + httptools by default,
asyncio + h11 on request, the same audio either way (real ``ttsfleet serve`` subprocesses)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from ttsfleet.inference import server_loop

from ttsfleet.errors import UserError

pytest.importorskip("uvloop")
pytest.importorskip("httptools")

BODY = {"text": "One loop or the other, the same bytes.", "format": "pcm", "max_new_tokens": 40, "seed": 7,
        "streaming": True}


@pytest.fixture
def fresh_switches():
    """The two switches re-read from the environment before and after the test."""
    for switch in (server_loop.EVENT_LOOP_SWITCH, server_loop.HTTP_PARSER_SWITCH):
        switch.reset()
    yield
    for switch in (server_loop.EVENT_LOOP_SWITCH, server_loop.HTTP_PARSER_SWITCH):
        switch.reset()


def test_auto_prefers_the_c_implementations_and_each_can_be_named(fresh_switches, monkeypatch) -> None:
    assert (server_loop.event_loop_name(), server_loop.http_parser()) == ("uvloop", "httptools")
    monkeypatch.setenv(server_loop.EVENT_LOOP_ENV, "asyncio")
    monkeypatch.setenv(server_loop.HTTP_PARSER_ENV, "h11")
    server_loop.EVENT_LOOP_SWITCH.reset()
    server_loop.HTTP_PARSER_SWITCH.reset()
    assert (server_loop.event_loop_name(), server_loop.http_parser()) == ("asyncio", "h11")


def test_run_runs_the_coroutine_on_the_chosen_loop(fresh_switches) -> None:
    import asyncio

    import uvloop

    seen = []

    async def main() -> None:
        seen.append(type(asyncio.get_running_loop()))

    server_loop.run(main)
    server_loop.EVENT_LOOP_SWITCH.set("asyncio")
    server_loop.run(main)
    assert seen[0] is uvloop.Loop and not issubclass(seen[1], uvloop.Loop)


def test_a_named_implementation_that_is_missing_is_one_clear_error(fresh_switches, monkeypatch) -> None:
    monkeypatch.setattr(server_loop, "_installed", lambda module: False)
    assert server_loop.event_loop_name() == "asyncio"  # auto falls back
    server_loop.HTTP_PARSER_SWITCH.set("httptools")
    with pytest.raises(UserError, match=r"^TTSFLEET_HTTP_PARSER=httptools: httptools is not installed"):
        server_loop.http_parser()


def test_a_bad_value_stops_serve_with_exit_2_and_one_line() -> None:
    env = {"TTSFLEET_EVENT_LOOP": "trio", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-P", "-m", "ttsfleet.cli", "serve", "--checkpoint", "tiny"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "TTSFLEET_EVENT_LOOP='trio': expected one of auto, uvloop, asyncio" in done.stderr
    assert "Traceback" not in done.stderr


def test_both_loops_serve_the_same_streamed_audio(server_factory) -> None:
    fast = server_factory("--log-level", "info")
    plain = server_factory("--log-level", "info",
                           env={"TTSFLEET_EVENT_LOOP": "asyncio", "TTSFLEET_HTTP_PARSER": "h11"})
    audio = []
    for srv in (fast, plain):
        with srv.client() as c:
            r = c.post("/v1/tts", json=BODY)
            assert r.status_code == 200, r.text
            audio.append(r.content)
    assert len(audio[0]) > 0 and audio[0] == audio[1]
    assert "event loop uvloop, HTTP parser httptools" in fast.log_path.read_text()
    assert "event loop asyncio, HTTP parser h11" in plain.log_path.read_text()
