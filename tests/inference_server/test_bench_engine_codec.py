"""``ttsfleet bench engine`` with a codec in the loop: the codec's push timings go under
``codec_push_ms``, not ``codec`` (``bench serve``'s per-level codec use, which the table's lines read
by ``concurrency``: a push row there crashed the table with ``KeyError: 'concurrency'``)."""

from __future__ import annotations

import json
from pathlib import Path

from .test_bench_gate import _cli


def test_engine_bench_with_the_tiny_codec_prints_its_table(tmp_path: Path) -> None:
    """The tiny model and codec (codec thread) on CPU, one short request: the run finishes, the report
    holds the codec's push timings and stdout the table. Most of its seconds are the push timings."""
    r = _cli("engine", "--checkpoint", "tiny", "--codec", "tiny", "--device", "cpu", "--concurrency", "1",
             "--prompt-tokens", "4", "--frames", "2", "--per-client", "1", "--no-breakdown", "--out",
             str(tmp_path))
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads((tmp_path / "bench.json").read_text())
    assert "codec" not in report  # that key is bench serve's per-level codec use
    rows = report["codec_push_ms"]
    assert rows and all(row["ms"] > 0 and row["frames_per_s"] > 0 for row in rows)
    assert {row["graphs"] for row in rows} == {False}  # CPU: eager pushes only
    (lv,) = report["levels"]
    assert lv["concurrency"] == 1 and lv["errors"] == 0
    assert "ttsfleet bench engine --checkpoint tiny --codec tiny" in r.stdout and "frames/s" in r.stdout
    assert "c=1 engine thread over" in r.stdout and "codec thread busy" in r.stdout
