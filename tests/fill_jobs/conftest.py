"""Fixtures for the fill-job tests: espeak-ng corpora, reference runs, and a CLI runner.

Corpora are synthesized once per session (a few seconds). Jobs run as real subprocesses of the
real CLI whenever signals, exit codes or crashes are involved.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from ttsfleet.fill_jobs.corpus import espeak_available

needs_espeak = pytest.mark.skipif(not espeak_available(), reason="needs espeak-ng")


@dataclass
class JobDirs:
    output: Path
    checkpoint: Path


def fill_cmd(manifest: Path, dirs: JobDirs, *extra: str) -> list[str]:
    return [sys.executable, "-m", "ttsfleet.cli", "fill", "run", "--input", str(manifest),
            "--output", str(dirs.output), "--checkpoint", str(dirs.checkpoint), *extra]


def run_fill(manifest: Path, dirs: JobDirs, *extra: str, env: dict | None = None,
             timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``ttsfleet fill run`` to the end in a subprocess."""
    return subprocess.run(fill_cmd(manifest, dirs, *extra), capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def start_fill(manifest: Path, dirs: JobDirs, *extra: str, env: dict | None = None) -> subprocess.Popen:
    """Start ``ttsfleet fill run`` in the background (stderr: JSON events, one per line)."""
    return subprocess.Popen(fill_cmd(manifest, dirs, *extra), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})


def wait_for_event(proc: subprocess.Popen, event: str, timeout: float = 60) -> dict:
    """Read the job's stderr until ``event`` appears (or the process ends)."""
    import selectors
    import time

    sel = selectors.DefaultSelector()
    sel.register(proc.stderr, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not sel.select(timeout=0.5):
            continue
        line = proc.stderr.readline()
        if not line:
            break
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if rec.get("event") == event:
            return rec
    raise AssertionError(f"job never emitted {event!r} (exit {proc.poll()})")


def output_tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` except summaries: relative path -> bytes."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.name.startswith("summary.")}


def manifest_rows(root: Path) -> list[dict]:
    rows = []
    for p in sorted(root.glob("manifest.shard-*.jsonl")):
        rows.extend(json.loads(line) for line in p.read_text().splitlines())
    return rows


class FillCli:
    """The helpers above, handed to tests as the ``cli`` fixture (conftest is not importable
    under ``--import-mode=importlib``)."""

    JobDirs = JobDirs
    cmd = staticmethod(fill_cmd)
    run = staticmethod(run_fill)
    start = staticmethod(start_fill)
    wait_for_event = staticmethod(wait_for_event)
    output_tree = staticmethod(output_tree)
    manifest_rows = staticmethod(manifest_rows)


@pytest.fixture(scope="session")
def cli() -> type[FillCli]:
    return FillCli


@pytest.fixture
def dirs(tmp_path: Path) -> JobDirs:
    return JobDirs(tmp_path / "out", tmp_path / "ckpt")


@pytest.fixture(scope="session")
def clean_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not espeak_available():
        pytest.skip("needs espeak-ng")
    from ttsfleet.fill_jobs.corpus import make_corpus

    return make_corpus(tmp_path_factory.mktemp("clean"), 10, seed=3)


@pytest.fixture(scope="session")
def mixed_corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str | None]]:
    if not espeak_available():
        pytest.skip("needs espeak-ng")
    from ttsfleet.fill_jobs.corpus import make_mixed_corpus

    return make_mixed_corpus(tmp_path_factory.mktemp("mixed"), seed=0, n_clean=4)


@pytest.fixture(scope="session")
def mixed_reference(tmp_path_factory: pytest.TempPathFactory,
                    mixed_corpus: tuple[Path, dict]) -> JobDirs:
    """One uninterrupted default-stage run over the mixed corpus (a real subprocess)."""
    base = tmp_path_factory.mktemp("mixed-ref")
    ref = JobDirs(base / "out", base / "ckpt")
    proc = run_fill(mixed_corpus[0], ref, "--checkpoint-every-items", "5")
    assert proc.returncode == 0, proc.stderr
    return ref


@pytest.fixture(scope="session")
def fast_reference(tmp_path_factory: pytest.TempPathFactory, clean_corpus: Path) -> JobDirs:
    """One uninterrupted ``decode,hash`` run over the clean corpus."""
    base = tmp_path_factory.mktemp("fast-ref")
    ref = JobDirs(base / "out", base / "ckpt")
    proc = run_fill(clean_corpus, ref, "--stages", "decode,hash")
    assert proc.returncode == 0, proc.stderr
    return ref
