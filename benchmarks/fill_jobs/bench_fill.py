"""Fill-job throughput on CPU and the cost of checkpointing.

Synthesizes an espeak-ng corpus, then runs the job in-process (start-up excluded) for the fast
stages and the default stages, at the default checkpoint interval and at a 10x more frequent one.
Prints a table (items/s, audio-hours per hour, commits, checkpoint overhead = share of run time
spent committing outputs and writing checkpoints) and appends it, with date and machine, to
``benchmarks/fill_jobs/RESULTS.md``.

    python benchmarks/fill_jobs/bench_fill.py [--items 200] [--no-record]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import io
import os
import platform
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table
from ttsfleet.fill_jobs.checkpoint import load_all
from ttsfleet.fill_jobs.corpus import make_corpus
from ttsfleet.fill_jobs.runner import RunOptions, run_job
from ttsfleet.fill_jobs.settings import DEFAULT_STAGES, FAST_STAGES

RESULTS = Path(__file__).with_name("RESULTS.md")


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    load = os.getloadavg()[0]
    return f"{cpu}, {os.cpu_count()} CPUs, load {load:.1f}, {platform.system()} {platform.release()}"


def one_run(manifest: Path, work: Path, name: str, stages: tuple[str, ...], every_items: int) -> dict:
    opts = RunOptions(input=manifest, output=work / name / "out", checkpoint=work / name / "ckpt",
                      stages=stages, checkpoint_every_items=every_items, interactive=False)
    t0 = time.perf_counter()
    with contextlib.redirect_stderr(io.StringIO()):
        assert run_job(opts) == 0
    wall = time.perf_counter() - t0
    (ckpt,) = load_all(opts.checkpoint)
    return {"run": name, "stages": ",".join(stages), "every": every_items, "items": ckpt.items_total,
            "wall": wall, "items_s": ckpt.items_total / wall,
            "audio_h_per_h": ckpt.audio_seconds / wall, "commits": ckpt.parts,
            "overhead": ckpt.commit_seconds / max(ckpt.active_seconds, 1e-9)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=200)
    ap.add_argument("--no-record", action="store_true")
    args = ap.parse_args()
    console = Console(width=130)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        with console.status(f"synthesizing {args.items} utterances with espeak-ng"):
            manifest = make_corpus(work / "corpus", args.items, seed=11)
        rows = []
        plan = [("fast", FAST_STAGES, 100), ("fast-ckpt10", FAST_STAGES, 10),
                ("default", DEFAULT_STAGES, 100), ("default-ckpt10", DEFAULT_STAGES, 10)]
        for name, stages, every in plan:
            with console.status(f"running {name}"):
                rows.append(one_run(manifest, work, name, stages, every))
    table = Table(title=f"ttsfleet fill on CPU, {args.items} espeak-ng items "
                        f"({dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC)")
    for col in ("run", "stages", "ckpt every", "items/s", "audio-h/h", "commits", "ckpt overhead"):
        table.add_column(col, justify="right" if col not in ("run", "stages") else "left")
    for r in rows:
        table.add_row(r["run"], r["stages"], f"{r['every']} items", f"{r['items_s']:.1f}",
                      f"{r['audio_h_per_h']:.0f}", str(r["commits"]), f"{100 * r['overhead']:.2f}%")
    console.print(table)
    console.print(f"machine: {machine()}")
    if args.no_record:
        return
    lines = [f"\n## {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC — {machine()}\n",
             f"{args.items} espeak-ng items (~4 s each), torch {_torch_version()}, in-process "
             "(start-up excluded). Overhead = time committing outputs + writing checkpoints / run time.\n",
             "| run | stages | checkpoint every | items/s | audio-hours/hour | commits "
             "| checkpoint overhead |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['run']} | {r['stages']} | {r['every']} items | {r['items_s']:.1f} | "
              f"{r['audio_h_per_h']:.0f} | {r['commits']} | {100 * r['overhead']:.2f}% |" for r in rows]
    with open(RESULTS, "a", encoding="utf-8") as fh:
        if fh.tell() == 0:
            fh.write("# Fill-job benchmark results\n\nAppended by `bench_fill.py`; newest last.\n")
        fh.write("\n".join(lines) + "\n")
    console.print(f"recorded in {RESULTS}")


def _torch_version() -> str:
    import torch

    return torch.__version__


if __name__ == "__main__":
    main()
