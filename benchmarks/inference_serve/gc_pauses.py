"""The server's garbage-collection pauses under load, with the start-up heap frozen (``serve``'s default)
and without (``--no-gc-freeze``), side by side.

Why: a full (generation-2) collection stops every thread of the server while it walks every tracked
object, and after torch and the server's imports there are ~219k of them (~80 ms a pass on the 2-core
CPU box, 2026-12-07): at c=128 on an H100 the client's first-audio p99 (313-695 ms) sits well above the
server's own stage p99s (~250 ms), and such pauses would land in it. This drives two ``ttsfleet serve``
processes (the tiny model on the CPU unless told otherwise) in turn with the real ``ttsfleet bench serve``
client at one concurrency, reads ``inference_gc_pause_seconds`` from /metrics before and after each
bench, and reports per generation the collections, their summed pause and the bucket of the longest,
beside what the bench saw (frames/s, first audio p50 / p99, the client's own collections) and the
number of objects the server froze (from its log: a remote heap cannot be counted). The sides
alternate round by round, so a noisy machine hits both alike.

    python3 -P benchmarks/inference_serve/gc_pauses.py OUT [--concurrency 32 --per-client 12 --rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SIDES = {"frozen": [], "unfrozen": ["--no-gc-freeze"]}  # serve's default, and the flag that turns it off
FROZE = re.compile(r"froze (\d+) objects in (\d+) ms")


def _cli() -> list[str]:
    from ttsfleet.devtools.serve_proc import python_cmd

    return [*python_cmd(), "-m", "ttsfleet.cli"]


def start_server(flags: list[str], log: Path) -> tuple[subprocess.Popen, str]:
    """``ttsfleet serve`` on a free port, logging at info (the freeze's line), ready or exit."""
    from ttsfleet.devtools.serve_proc import start_serve

    return start_serve(flags, log, log_level="info")


def stop_server(proc: subprocess.Popen) -> None:
    from ttsfleet.devtools.serve_proc import stop_serve

    stop_serve(proc)


def gc_read(url: str) -> dict[str, dict[str, Any]]:
    """``inference_gc_pause_seconds`` per generation from one /metrics read: count, sum (s) and the
    cumulative buckets ``{le: count}``."""
    from ttsfleet.inference.bench import server_samples

    from ttsfleet.metrics import spec

    samples = server_samples(url)
    if not samples:
        sys.exit(f"could not read {url}/metrics")
    name = spec("inference_gc_pause_seconds").name
    out: dict[str, dict[str, Any]] = {}
    for smp in samples:
        if not smp.name.startswith(name):
            continue
        gen = out.setdefault(smp.labels["generation"], {"count": 0.0, "sum": 0.0, "buckets": {}})
        if smp.name == name + "_bucket":
            gen["buckets"][float(smp.labels["le"])] = smp.value
        elif smp.name in (name + "_count", name + "_sum"):
            gen[smp.name.rsplit("_", 1)[1]] = smp.value
    return out


def gc_growth(before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per generation between two reads: collections, summed pause (ms) and the upper bound of the bucket
    holding the longest (ms; None where none ran)."""
    from ttsfleet.inference.bench_engine_loop import bucket_of_longest

    out = {}
    for gen in sorted(after):
        a, b = after[gen], before.get(gen, {"count": 0.0, "sum": 0.0, "buckets": {}})
        count = round(a["count"] - b["count"])
        grown = sorted((le, n - b["buckets"].get(le, 0.0)) for le, n in a["buckets"].items())
        longest = bucket_of_longest(grown, count) if count else None
        out[f"gen{gen}"] = {"collections": count, "total_ms": round(1000 * (a["sum"] - b["sum"]), 2),
                            "longest_le_ms": None if longest is None else round(1000 * longest, 2)}
    return out


def bench(url: str, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """One ``ttsfleet bench serve`` level against ``url``: its report's level, engine and wall time."""
    t0 = time.perf_counter()
    done = subprocess.run([*_cli(), "bench", "serve", "--url", url, "--concurrency", str(args.concurrency),
                           "--per-client", str(args.per_client), "--max-new-tokens", str(args.max_new_tokens),
                           "--out", str(out)], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"bench serve failed: {done.stderr[-2000:]}")
    report = json.loads((out / "bench.json").read_text())
    level = report["levels"][0]
    return {"wall_s": round(time.perf_counter() - t0, 1), "frames_per_s": round(level["frames_per_s"], 1),
            "ttfa_p50_ms": round(1000 * level["ttfa_p50_s"]),
            "ttfa_p99_ms": round(1000 * level["ttfa_p99_s"]), "errors": level["errors"],
            "requests": level["requests"], "client_gc": level.get("client_gc", {}),
            "engine": (report.get("engine") or [{}])[0]}


def one_side(side: str, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """Start the side's server, bench it once, read its collections over the bench, stop it."""
    folder = out / side
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "serve.log"
    proc, url = start_server([*args.serve_flags, *SIDES[side]], log)
    try:
        at_start = gc_read(url)
        seen = bench(url, args, folder)
        at_end = gc_read(url)
    finally:
        stop_server(proc)
    froze = FROZE.search(log.read_text(errors="replace"))
    return {"side": side, "frozen_objects": int(froze[1]) if froze else 0,
            "freeze_ms": int(froze[2]) if froze else None, "start_up": gc_growth({}, at_start),
            "bench": gc_growth(at_start, at_end), **seen}


def machine() -> dict[str, Any]:
    """Cores and CPU model of this machine (where the server and the client both ran)."""
    cpuinfo = Path("/proc/cpuinfo")
    names = re.findall(r"^model name\s*:\s*(.+)$", cpuinfo.read_text(), re.M) if cpuinfo.exists() else []
    return {"nproc": os.cpu_count(), "cpu": names[0].strip() if names else "unknown",
            "python": sys.version.split()[0]}


def print_report(rows: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="server garbage collections over one bench level (per generation: collections, "
                        "summed pause ms, longest <= bucket ms)")
    for col in ("round", "side", "frozen objects", "gen 0", "gen 1", "gen 2", "frames/s", "TTFA p50 / p99 ms",
                "client gen 2"):
        table.add_column(col, justify="right")
    for row in rows:
        gens = [row["bench"].get(f"gen{g}", {}) for g in range(3)]
        cells = [f"{g.get('collections', 0)}, {g.get('total_ms', 0):.1f}, <= {g.get('longest_le_ms') or '-'}"
                 for g in gens]
        client = row["client_gc"].get("gen2", {})
        table.add_row(str(row["round"]), row["side"], f"{row['frozen_objects']:,}", *cells,
                      f"{row['frames_per_s']:.1f}", f"{row['ttfa_p50_ms']} / {row['ttfa_p99_ms']}",
                      f"{client.get('count', 0)}, max {client.get('max_ms', float('nan')):.0f} ms")
    Console(width=200).print(table)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--per-client", type=int, default=12, help="closed-loop requests per client")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=2, help="each round runs both sides, in turn")
    ap.add_argument("--checkpoint", default="tiny")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    args.serve_flags = ["--checkpoint", args.checkpoint, "--device", args.device, "--max-running-requests",
                        str(args.concurrency), "--max-queue", str(4 * args.concurrency)]
    rows = []
    for r in range(args.rounds):
        order = list(SIDES) if r % 2 == 0 else list(reversed(SIDES))
        for side in order:
            rows.append({"round": r + 1, **one_side(side, args, args.out / f"round{r + 1}")})
            print(f"round {r + 1} {side}: {json.dumps(rows[-1]['bench'])}", flush=True)
    print_report(rows)
    report = {"date": time.strftime("%Y-%m-%d"), "machine": machine(),
              "args": {**{k: v for k, v in vars(args).items() if k != "out"}, "out": str(args.out)},
              "rows": rows}
    (args.out / "gc_pauses.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out / 'gc_pauses.json'}")


if __name__ == "__main__":
    main()
