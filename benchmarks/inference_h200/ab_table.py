"""One served A/B call's sides as the markdown table the README's session sections give.

Usage: ``python3 -P benchmarks/inference_h200/ab_table.py FOLDER`` where FOLDER holds the ``ab``
stage's sides (``a1/``, ``b1/``, ``a2/`` ... each with ``served_c<N>/bench.json``; or a ``serve``
stage's one side, ``serve/``) and its log (``run-ab.log``: each side's flags and NVML busy per level).
Why: the tables were typed from the text output by hand (2026-12-06c), which is slow and can slip a
digit; this reads the sides' JSON.
Columns: frames/s (and the failed requests, where any failed), first audio p50 / p99, RTF p50 / p99,
the listener's underruns (share of requests, summed silence p99), the codec's frames a push and busy
share, NVML busy, and the engine's step interval by phase — with, where the server exported them,
the step's GPU work in situ, the GIL probe's mean wait, the event loop's lateness p99 and the full
garbage collections (how many, their pause p99).
"""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path
from typing import Any

#: An ab stage's sides (a1, b1, a2, ...) or a serve stage's one side (serve).
SIDE_NAME = r"[ab]\d+|serve"
SIDE = re.compile(rf"/(?P<side>{SIDE_NAME}) \[(?P<flags>[^\]]*)\]: server ready")
NVML = re.compile(rf"/(?P<side>{SIDE_NAME}) c=(?P<c>\d+) NVML busy \(middle 80% of the run\): "
                  r"mean (?P<mean>[\d.]+)%")
HEADER = ("| c | side | frames/s | TTFA p50 / p99 ms | RTF p50 / p99 | underruns, silence p99 | "
          "codec: frames a push, busy | NVML busy | engine step ms: gpu_wait / launch / prefill / other |")


def side_flags(log: str) -> dict[str, str]:
    """Each side's extra server flags as the log names them ("" for the defaults)."""
    return {m["side"]: m["flags"].strip() for m in SIDE.finditer(log)}


def nvml_busy(log: str) -> dict[tuple[str, int], float]:
    return {(m["side"], int(m["c"])): float(m["mean"]) for m in NVML.finditer(log)}


def _steady(report: dict[str, Any], key: str, c: int) -> dict[str, Any]:
    return next((row for row in report.get(key, []) if row.get("concurrency") == c), {})


def engine_cell(engine: dict[str, Any]) -> str:
    if not engine:
        return "-"
    phases = engine["per_step_ms"]
    cell = f"{engine['step_ms']:.1f}: " + " / ".join(f"{phases.get(p, 0.0):.1f}" for p in
                                                      ("gpu_wait", "launch", "prefill", "other"))
    if engine.get("gpu_ms"):
        cell += "; GPU " + ", ".join(f"{w} {ms:.1f}" for w, ms in engine["gpu_ms"].items())
    if "prefill_gpu_ms_per_1k_tokens" in engine:
        cell += (f"; prefill {engine['prefill_tokens_per_step']:.0f} tok a step, "
                 f"{engine['prefill_gpu_ms_per_1k_tokens']:.1f} ms/1k")
    if "gil_wait_ms" in engine:
        cell += f"; GIL {engine['gil_wait_ms']:.2f}"
    if engine.get("loop_lag_p99_ms") is not None:  # the server's event loop (2026-12-07 on)
        cell += f"; loop late p99 {engine['loop_lag_p99_ms']:.1f}"
    if "gc2_count" in engine:  # the server's full garbage collections (2026-12-07 on)
        p99 = engine.get("gc2_p99_ms")
        cell += f"; gc2 {engine['gc2_count']}×" + (f", p99 {p99:.1f} ms" if p99 is not None else "")
    return cell


def _client_lag(lv: dict[str, Any]) -> str:
    """How late the bench client's own loop ran (p99 ms) and how long it waited for the response headers
    (p99 ms), where the report has them (2026-12-07 on): first audio read that much late is the
    client's, and the wait before the headers comes before the server's first-audio figures start."""
    lag = lv.get("client_loop_lag") or {}
    notes = [f"client late p99 {lag['p99_ms']:.0f}"] if lag.get("ticks") else []
    headers = lv.get("headers_p99_s")  # the wait for the response headers (2026-12-07d on)
    if headers is not None and not math.isnan(headers):
        notes.append(f"headers p99 {headers * 1000:.0f}")
    outside = lv.get("outside_p99_s")  # of it, outside the server's app (2026-12-07e on)
    if outside is not None and not math.isnan(outside):
        notes.append(f"outside app p99 {outside * 1000:.0f}")
    return f" ({'; '.join(notes)})" if notes else ""


def row(side: str, label: str, c: int, report: dict[str, Any], busy: float | None) -> str:
    lv = next(level for level in report["levels"] if level["concurrency"] == c)
    codec = _steady(report, "codec_steady", c)
    under = (f"{lv['stalled_share']:.1%}, {lv['stall_p99_s'] * 1000:.0f} ms"
             if lv.get("stalled_share") is not None else "-")
    frames = f"{lv['frames_per_s']:,.1f}"
    if lv.get("errors"):  # a side whose requests failed (a dead server) must not read as a figure
        frames += f" (**{lv['errors']:,} of {lv['requests']:,} requests failed**)"
    cells = [str(c), f"{side[0].upper()}{': ' + label if label else ''}", frames,
             f"{lv['ttfa_p50_s'] * 1000:.0f} / {lv['ttfa_p99_s'] * 1000:.0f}" + _client_lag(lv),
             f"{lv['rtf_p50']:.3f} / {lv['rtf_p99']:.3f}", under,
             f"{codec['frames_per_push']:.1f}, {codec['busy_share']:.0%}" if codec else "-",
             f"{busy:.1f} %" if busy is not None else "-",
             engine_cell(_steady(report, "engine_steady", c))]
    return "| " + " | ".join(cells) + " |"


def table(folder: Path) -> list[str]:
    """The rows, levels in order, each level's sides in the order they ran (a1, b1, a2, b2, ...)."""
    log = (folder / "run-ab.log").read_text() if (folder / "run-ab.log").exists() else ""
    flags, busy = side_flags(log), nvml_busy(log)
    sides = sorted((p for p in folder.iterdir() if p.is_dir() and re.fullmatch(SIDE_NAME, p.name)),
                   key=lambda p: (0, p.name) if p.name == "serve" else (int(p.name[1:]), p.name[0]))
    reports = {(s.name, int(b.parent.name.removeprefix("served_c"))): json.loads(b.read_text())
               for s in sides for b in s.glob("served_c*/bench.json")}
    if not reports:
        raise ValueError(f"no <side>/served_c<N>/bench.json under {folder}")
    levels = sorted({c for _, c in reports})
    lines = [HEADER, "|---:|---|---:|---:|---:|---:|---|---:|---|"]
    for c in levels:
        for s in sides:
            if (s.name, c) in reports:
                report = reports[(s.name, c)]
                lines.append(row(s.name, flags.get(s.name, ""), c, report, busy.get((s.name, c))))
    return lines


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print("usage: ab_table.py FOLDER (an ab stage's output: a1/, b1/, ..., run-ab.log)", file=sys.stderr)
        return 2
    try:
        lines = table(Path(argv[0]))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
