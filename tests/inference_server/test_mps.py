"""The codec process under CUDA's MPS (``inference/mps.py``).

The MPS daemon needs an NVIDIA driver: the real one runs where ``nvidia-cuda-mps-control`` and CUDA
are there (skipped otherwise). On CPU: when the server asks for MPS, how it joins a node's daemon,
and what it says when the control binary is missing.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ttsfleet.inference import mps
from ttsfleet.inference.serve_config import ServeConfig

from ttsfleet.errors import UserError


@pytest.mark.parametrize(("mode", "codec_process", "device", "want"), [
    ("auto", True, "cuda", True), ("auto", True, "auto", True), ("on", True, "cuda:1", True),
    ("auto", False, "cuda", False),  # the codec thread: one context, nothing to share
    ("auto", True, "cpu", False), ("on", True, "cpu", False), ("off", True, "cuda", False),
])
def test_mps_is_wanted_only_for_a_codec_process_on_the_gpu(mode, codec_process, device, want):
    assert mps.wanted(mode, codec_process, device) is want


def test_an_unknown_mode_is_a_user_error():
    with pytest.raises(UserError, match="not auto, on, off"):
        mps.check_mode("sometimes", "--mps")
    with pytest.raises(UserError, match="TTSFLEET_MPS"):
        ServeConfig.from_env({"TTSFLEET_MPS": "sometimes"}, checkpoint="tiny")
    assert ServeConfig.from_env({"TTSFLEET_MPS": " OFF "}, checkpoint="tiny").mps == "off"


def test_without_the_control_binary_auto_warns_and_on_refuses(monkeypatch, caplog):
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    missing = "ttsfleet-no-such-mps-control"
    with caplog.at_level(logging.WARNING, "ttsfleet.inference.mps"):
        assert mps.start("auto", control=missing) is None
    assert "time-slicing" in caplog.text
    with pytest.raises(UserError, match="not on PATH"):
        mps.start("on", control=missing)
    assert "CUDA_MPS_PIPE_DIRECTORY" not in os.environ


def test_a_node_daemon_is_joined_not_started_nor_stopped(monkeypatch, tmp_path):
    """The device plugin's MPS sharing sets the pipe directory: the server uses that daemon and
    leaves it running when it exits."""
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path))
    daemon = mps.start("on", control="ttsfleet-no-such-mps-control")  # no binary needed to join
    assert daemon is not None and not daemon.owned and daemon.pipe_dir == tmp_path
    daemon.stop()  # owned=False: nothing to run (the binary does not exist; no error)


def test_the_server_cli_rejects_a_bad_mode_in_one_line():
    done = subprocess.run([sys.executable, "-P", "-m", "ttsfleet.cli", "serve", "--mps", "maybe"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2
    assert done.stderr.strip() == "error: mps mode 'maybe' (--mps / TTSFLEET_MPS) is not auto, on, off"


def processes_on(pipe_dir) -> list[int]:
    """Pids whose environment names ``pipe_dir`` as their MPS pipe directory: the daemon, its
    server and any control client asked to ``quit`` (its control file stays after it quits: H200,
    2026-12-04, so the file is no sign of life)."""
    want = f"CUDA_MPS_PIPE_DIRECTORY={pipe_dir}".encode()
    pids = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            env, cmd = (proc / "environ").read_bytes().split(b"\0"), (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if want in env and b"nvidia-cuda-mps" in cmd:
            pids.append(int(proc.name))
    return pids


def assert_the_daemon_goes(daemon: mps.MpsDaemon, within_s: float = 15) -> None:
    deadline = time.monotonic() + within_s
    while processes_on(daemon.pipe_dir) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_on(daemon.pipe_dir) == []


def test_processes_on_a_pipe_directory_are_found_until_they_go(tmp_path):
    """The real-daemon tests' sign of life (see processes_on), checked on a stand-in daemon."""
    pipe_dir = tmp_path / "pipe"
    # sleep exec'd directly under the daemon's name: Popen returns once that exec is done (a shell
    # script exec'ing it afterwards left a window in which the stand-in was not yet itself)
    proc = subprocess.Popen(["nvidia-cuda-mps-control", "30"], executable=shutil.which("sleep"),
                            env={**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe_dir)})
    try:
        deadline = time.monotonic() + 5
        while not processes_on(pipe_dir) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert processes_on(pipe_dir) == [proc.pid]
        assert processes_on(tmp_path / "elsewhere") == []
    finally:
        proc.kill()
        proc.wait()
    assert processes_on(pipe_dir) == []


@pytest.mark.skipif(shutil.which(mps.CONTROL) is None, reason="needs nvidia-cuda-mps-control (a GPU node)")
def test_a_real_daemon_starts_and_quits(monkeypatch):
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    monkeypatch.delenv("CUDA_MPS_LOG_DIRECTORY", raising=False)
    daemon = mps.start("on")
    try:
        assert daemon is not None and daemon.owned
        assert (daemon.pipe_dir / "control").exists()
        assert os.environ["CUDA_MPS_PIPE_DIRECTORY"] == str(daemon.pipe_dir)
    finally:
        daemon.stop()
    assert_the_daemon_goes(daemon)


def test_stop_does_not_wait_for_a_daemon_that_answers_only_after_its_last_client(tmp_path):
    """The real daemon answers ``quit`` once every client is gone, and the serving process is a
    client until it exits: stop() must hand the request over and return (here a stand-in control
    that reads the request, records it and then hangs, as the real one did for 10 s at every stop)."""
    said = tmp_path / "said.txt"
    hangs = tmp_path / "mps-control-that-hangs"
    hangs.write_text(f"#!/bin/sh\nread line\necho \"$line\" > {said}\nexec sleep 60\n")
    hangs.chmod(0o755)
    daemon = mps.MpsDaemon(str(hangs), tmp_path / "pipe", tmp_path / "log", owned=True)
    t0 = time.monotonic()
    daemon.stop()
    assert time.monotonic() - t0 < 5
    assert said.read_text().strip() == "quit"


@pytest.mark.skipif(shutil.which(mps.CONTROL) is None, reason="needs nvidia-cuda-mps-control (a GPU node)")
def test_a_real_daemon_quits_after_its_last_client_without_holding_stop(monkeypatch):
    """A client (a child with a CUDA context) alive at stop(): stop() returns at once, the daemon
    goes when the client does."""
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    monkeypatch.delenv("CUDA_MPS_LOG_DIRECTORY", raising=False)
    daemon = mps.start("on")
    client = subprocess.Popen([sys.executable, "-P", "-c", "import sys, torch; torch.zeros(1, device='cuda');"
                               "torch.cuda.synchronize(); print('up', flush=True); sys.stdin.read()"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert client.stdout.readline().strip() == "up"
        t0 = time.monotonic()
        daemon.stop()
        assert time.monotonic() - t0 < 5
    finally:
        client.communicate("", timeout=60)
    assert_the_daemon_goes(daemon)


@pytest.mark.parametrize(("env", "want"), [
    ({"TTSFLEET_GPU_CLASS": "h200", "TTSFLEET_DEVICE": "cuda"}, True),  # the H200's catalog default
    ({"TTSFLEET_GPU_CLASS": "h200", "TTSFLEET_DEVICE": "cpu"}, False),  # never on the CPU by default
    ({"TTSFLEET_GPU_CLASS": "h200", "TTSFLEET_DEVICE": "cuda", "TTSFLEET_CODEC_PROCESS": "0"}, False),
    ({"TTSFLEET_GPU_CLASS": "rtx5090", "TTSFLEET_DEVICE": "cuda"}, False),  # not measured there
    ({"TTSFLEET_DEVICE": "cpu", "TTSFLEET_CODEC_PROCESS": "1"}, True),
    ({}, False),
])
def test_the_codec_process_defaults_from_the_gpu_class(env, want):
    assert ServeConfig.from_env(env, checkpoint="tiny").codec_process is want


def test_a_daemon_that_does_not_start_is_a_warning_in_auto_and_an_error_when_on(monkeypatch, tmp_path,
                                                                                caplog):
    """A control binary that fails (here a stand-in that exits 1 with a message, as the real one does
    without a usable driver): ``auto`` serves on without MPS, ``on`` stops with the daemon's reason."""
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    failing = tmp_path / "mps-control-that-fails"
    failing.write_text("#!/bin/sh\necho 'no usable driver' >&2\nexit 1\n")
    failing.chmod(0o755)
    with caplog.at_level(logging.WARNING, "ttsfleet.inference.mps"):
        assert mps.start("auto", control=str(failing)) is None
    assert "no usable driver" in caplog.text and "CUDA_MPS_PIPE_DIRECTORY" not in os.environ
    with pytest.raises(UserError, match="no usable driver"):
        mps.start("on", control=str(failing))


def _switch_setter(monkeypatch, switch):  # noqa: ANN001, ANN202
    """Sets ``switch``'s variable for one test, the switch re-read before and after."""
    def set_to(value: str) -> None:
        monkeypatch.setenv(switch.env, value)
        switch.reset()
    yield set_to
    monkeypatch.delenv(switch.env, raising=False)
    switch.reset()


@pytest.fixture
def codec_sm_percent(monkeypatch):
    """Sets ``TTSFLEET_CODEC_SM_PERCENT`` for one test."""
    yield from _switch_setter(monkeypatch, mps.CODEC_SM_PERCENT_SWITCH)


@pytest.mark.parametrize(("value", "device", "pipe", "want"), [
    ("40", "cuda", "/run/mps", 40), ("100", "cuda:1", "/run/mps", 100),
    ("off", "cuda", "/run/mps", None),  # the default: the codec takes every SM, as before
    ("40", "cpu", "/run/mps", None),    # no CUDA context to limit
    ("40", "cuda", "", None),           # no MPS daemon: CUDA ignores the variable, so it is not set
])
def test_the_codec_clients_thread_limit_is_set_only_on_cuda_under_mps(codec_sm_percent, value, device, pipe,
                                                                       want):
    codec_sm_percent(value)
    env = {"CUDA_MPS_PIPE_DIRECTORY": pipe} if pipe else {}
    assert mps.limit_codec_client(device, env) == want
    assert env.get(mps.MPS_THREAD_LIMIT_ENV) == (None if want is None else str(want))


@pytest.fixture
def codec_priority(monkeypatch):
    """Sets ``TTSFLEET_CODEC_MPS_PRIORITY`` for one test."""
    yield from _switch_setter(monkeypatch, mps.CODEC_PRIORITY_SWITCH)


@pytest.mark.parametrize(("value", "device", "pipe", "want"), [
    ("below-normal", "cuda", "/run/mps", True), ("Below-Normal", "cuda:1", "/run/mps", True),
    ("normal", "cuda", "/run/mps", False),     # the default: the codec's work as urgent as the step's
    ("below-normal", "cpu", "/run/mps", False),  # no CUDA context
    ("below-normal", "cuda", "", False),       # no MPS daemon: nothing to be a client of
])
def test_the_codec_clients_priority_is_lowered_only_on_cuda_under_mps(codec_priority, value, device, pipe,
                                                                      want):
    codec_priority(value)
    env = {"CUDA_MPS_PIPE_DIRECTORY": pipe} if pipe else {}
    assert mps.lower_codec_priority(device, env) is want
    assert env.get(mps.MPS_PRIORITY_ENV) == ("1" if want else None)


def test_the_codec_process_names_both_mps_settings_it_applied(codec_sm_percent, codec_priority, monkeypatch):
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", "/run/mps")
    for var in (mps.MPS_THREAD_LIMIT_ENV, mps.MPS_PRIORITY_ENV):
        monkeypatch.delenv(var, raising=False)
    assert mps.codec_client_note("cuda") == ""
    codec_priority("below-normal")
    assert mps.codec_client_note("cuda") == ", MPS priority below normal"
    codec_sm_percent("70")
    assert mps.codec_client_note("cuda") == ", MPS threads 70 %, MPS priority below normal"
    assert os.environ[mps.MPS_THREAD_LIMIT_ENV] == "70" and os.environ[mps.MPS_PRIORITY_ENV] == "1"


def test_a_bad_codec_sm_percent_is_refused_by_the_server_in_one_line():
    done = subprocess.run([sys.executable, "-P", "-m", "ttsfleet.cli", "serve", "--checkpoint", "tiny",
                           "--device", "cpu"], env={**os.environ, mps.CODEC_SM_PERCENT_ENV: "0"},
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2
    assert done.stderr.strip() == "error: TTSFLEET_CODEC_SM_PERCENT='0': expected off or a count 1..100"
