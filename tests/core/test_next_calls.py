"""``benchmarks/inference_h200/next_calls.sh``: every device call names stages that
``speed_run.sh`` has and fits its stage limits inside the device's 600 s per command. A typo there
is found on the GPU only after a machine start (~90 s of a session's 1,800) and a wasted call."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parents[2] / "benchmarks" / "inference_h200"
DEVICE_LIMIT_S = 600


def _speed_run_stages() -> set[str]:
    text = (HERE / "speed_run.sh").read_text()
    return {m for labels in re.findall(r"^    ([a-z0-9|]+)\)", text, re.M) for m in labels.split("|")}


def _calls() -> dict[str, list[list[str]]]:
    """Each call's ``stage`` lines as word lists (continuation lines joined); a call's short form
    (``1s``, ``1g``: part of call 1 for a budget short of all of it) is a call of its own."""
    text = (HERE / "next_calls.sh").read_text().replace("\\\n", "")
    body = text[text.index("case ${1:-} in"):text.index("esac")]
    calls: dict[str, list[list[str]]] = {}
    for m in re.finditer(r"^  (\d+[a-z]?)\)(.*?);;", body, re.M | re.S):
        lines = [ln.split("#")[0].strip() for ln in m.group(2).splitlines()]
        calls[m.group(1)] = [shlex.split(ln) for ln in lines if ln.startswith("stage ")]
    return calls


def test_every_call_runs_known_stages_inside_the_device_limit() -> None:
    known, calls = _speed_run_stages(), _calls()
    assert {"ab", "codectiles", "codeccompile", "encode", "sweep"} <= known
    numbered = [n for n in calls if n.isdigit()]
    assert numbered == [str(i) for i in range(1, len(numbered) + 1)]
    assert all(n[:-1] in numbered for n in calls if not n.isdigit()), "a short form of no call"
    for n, stages in calls.items():
        assert stages, f"call {n} runs no stage"
        for words in stages:
            assert words[-1] in known, f"call {n}: {words[-1]!r} is not a speed_run.sh stage"
            assert all("=" in w for w in words[3:-1]), f"call {n}: {words}: VAR=value words only"
        total = sum(int(words[2]) for words in stages)
        assert total <= DEVICE_LIMIT_S - 10, f"call {n}: stage limits sum to {total} s"


def test_an_unknown_call_is_one_usage_line_and_exit_2(tmp_path: Path) -> None:
    unknown = str(sum(n.isdigit() for n in _calls()) + 1)  # the first number past the last call
    proc = subprocess.run(["bash", str(HERE / "next_calls.sh"), unknown], capture_output=True, text=True,
                          timeout=30, env={"OUT": str(tmp_path), "PATH": "/usr/bin:/bin",
                                           # should the number be a call after all, run no real stage
                                           # (speed_run.sh links into the checkout and installs wheels)
                                           "SPEED_RUN": str(tmp_path / "no-speed-run.sh")})
    assert proc.returncode == 2 and proc.stderr.startswith("usage: next_calls.sh 1|")


def test_a_file_a_later_stage_reads_survives_the_bundling() -> None:
    """``speed_run.sh`` ends by moving every file two folders deep into ``served.tgz``; a later stage
    reading an earlier one's output must name a file at the top of that stage's folder, which the
    stage copies there (2026-12-05c: call 2's codeccompile read ``codectiles/codec_tiles/...``, gone
    into the archive, and stopped at its first line)."""
    text = (HERE / "next_calls.sh").read_text()
    reads = re.findall(r"\$O/([a-z]+)/([^\s\"']+)", text)
    assert reads, "no call reads an earlier stage's file (the check would test nothing)"
    speed_run = (HERE / "speed_run.sh").read_text()
    for stage, path in reads:
        assert "/" not in path, f"$O/{stage}/{path}: below the stage's top folder, bundled away"
        body = speed_run[speed_run.index(f"\n    {stage})"):]
        body = body[:body.index(";;")]
        assert re.search(rf"cp [^\n]*{re.escape(path)}\"? \"\$OUT/\"", body), \
            f"speed_run.sh's {stage} stage does not copy {path} to its top folder"
