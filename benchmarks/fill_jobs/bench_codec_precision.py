"""The codec stage at each ``codecPrecision``: speed, and how many codes stay equal to float32's.

Builds clips from a small espeak-ng corpus (a ``manifest.jsonl`` with ``audio`` paths, as
``ttsfleet fill corpus DIR -n 40`` writes it; made in ``--corpus`` when it has none and espeak-ng
is installed): utterances decoded and resampled to 24 kHz as the fill job does, joined with
pauses and varied gain into ``--clips`` clips of about ``--clip-seconds``. Then, for each
precision, a :class:`~ttsfleet.fill_jobs.tokenize.BatchEncoder` (the stage's own) encodes them:
one warm-up pass, then ``--repeats`` timed passes — device time from the stage's CUDA events on a
GPU, wall clock on the CPU. Agreement (:func:`~ttsfleet.fill_jobs.tokenize.code_agreement`): the
share of codes equal to float32's, per codebook (``cb0`` = the semantic codebook), overall and per
frame (all codebooks equal); float32's own row compares its first and last pass (run-to-run
determinism, the floor the other rows are read against).

Random weights say nothing about the real codec's agreement (its distances to the codebook entries
are distributed differently): the figure that matters needs ``--codec /models/codec.pth``.

    python3 -P benchmarks/fill_jobs/bench_codec_precision.py run --device cuda --codec s2-pro \\
        --corpus seeds --clips 16 --clip-seconds 10 --out codec_precision.json
    python3 -P benchmarks/fill_jobs/bench_codec_precision.py run --device cpu --codec tiny \\
        --corpus /tmp/espeak --clips 6 --clip-seconds 4 --threads 1 --out codec_precision.json
    python3 -P benchmarks/fill_jobs/bench_codec_precision.py report codec_precision.json [--no-record]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "RESULTS.md"
RATE = 24000  # the fill job's targetRate: the codec stage's input rate


def utterances(corpus: Path, items: int) -> list[np.ndarray]:
    """The corpus's utterances at ``RATE`` (synthesized first when the folder has no manifest)."""
    from ttsfleet.fill_jobs.audio_io import decode, resample

    manifest = corpus / "manifest.jsonl"
    if not manifest.exists():
        from ttsfleet.fill_jobs.corpus import make_corpus

        make_corpus(corpus, items)
    rows = [json.loads(line) for line in manifest.read_text().splitlines() if line.strip()]
    out = []
    for r in rows[:items]:
        x, rate = decode(str(corpus / r["audio"]))
        out.append(resample(x, rate, RATE).astype(np.float32))
    if not out:
        raise SystemExit(f"{manifest}: no utterances")
    return out


def make_clips(utts: list[np.ndarray], n: int, seconds: float) -> list[np.ndarray]:
    """``n`` clips of about ``seconds`` each: utterances in turn, random gain, pauses, a little noise;
    the same for the same corpus. Lengths differ a little (padding is part of the stage's work)."""
    rng = np.random.default_rng(0)
    clips, k = [], 0
    for i in range(n):
        target = int((seconds + 0.37 * (i % 3)) * RATE)
        parts, total = [], 0
        while total < target:
            u = utts[k % len(utts)] * np.float32(10 ** (rng.uniform(-6, 3) / 20))
            k += 1
            pause = np.zeros(int(rng.uniform(0.15, 0.5) * RATE), np.float32)
            parts += [u, pause]
            total += len(u) + len(pause)
        y = np.concatenate(parts)[:target]
        y = y + (10 ** (-55 / 20) * rng.standard_normal(len(y))).astype(np.float32)
        clips.append(np.clip(y, -1, 1).astype(np.float32))
    return clips


def measure(codec: str, device: str, precision: str, clips: list[np.ndarray], repeats: int,
            batch_seconds: float) -> tuple[dict, list[np.ndarray], list[np.ndarray]]:
    """Speed of one precision, and its codes from the first and the last timed pass."""
    from ttsfleet.fill_jobs.tokenize import BatchEncoder

    t0 = time.perf_counter()
    enc = BatchEncoder(codec, RATE, device, batch_seconds, precision)
    enc.encode(clips)  # warm-up (cuDNN autotune, allocator, lazy inits)
    load_s = time.perf_counter() - t0
    audio_s = sum(len(c) for c in clips) / RATE
    if enc.device.type == "cuda":
        import torch

        torch.cuda.synchronize()
    gpu0, t0 = enc.gpu_seconds, time.perf_counter()
    first = last = enc.encode(clips)
    for _ in range(repeats - 1):
        last = enc.encode(clips)
    wall = time.perf_counter() - t0
    timed = enc.gpu_seconds - gpu0 if enc.device.type == "cuda" else wall
    row = {"precision": precision, "clock": "cuda-events" if enc.device.type == "cuda" else "wall",
           "passes": repeats, "audio_seconds_per_pass": round(audio_s, 3),
           "seconds": round(timed, 4), "wall_seconds": round(wall, 4),
           "audio_s_per_s": round(audio_s * repeats / timed, 2), "load_and_warmup_s": round(load_s, 2),
           "trunk_dtype": str(enc.trunk_dtype).removeprefix("torch."), "split_path": enc.split}
    if enc.device.type == "cuda":
        import torch

        row["max_memory_allocated_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        del enc
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    return row, first, last


def machine(device: str, note: str) -> str:
    import torch

    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError, StopIteration):
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    parts = [f"{cpu}, {os.cpu_count()} CPUs"]
    if device.startswith("cuda") and shutil.which("nvidia-smi"):
        parts.insert(0, subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version",
                                        "--format=csv,noheader"], capture_output=True,
                                       text=True).stdout.strip().splitlines()[0])
    parts += [f"torch {torch.__version__} ({torch.get_num_threads()} threads)", platform.release()]
    if note:
        parts.append(note)
    return "; ".join(parts)


def cmd_run(a: argparse.Namespace) -> None:
    from ttsfleet.fill_jobs.tokenize import PRECISIONS, code_agreement

    if a.threads:
        import torch

        torch.set_num_threads(a.threads)
    precisions = [p.strip() for p in a.precisions.split(",") if p.strip()]
    if precisions[0] != "float32" or any(p not in PRECISIONS for p in precisions):
        raise SystemExit(f"--precisions: float32 first, then any of {', '.join(PRECISIONS)}")
    utts = utterances(Path(a.corpus), a.utterances)
    clips = make_clips(utts, a.clips, a.clip_seconds)
    load1 = os.getloadavg()[0]
    result = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "machine": machine(a.device, a.note), "device": a.device, "codec": a.codec, "clips": len(clips),
              "clip_seconds": [round(len(c) / RATE, 2) for c in clips], "utterances": len(utts),
              "codec_batch_seconds": a.batch_seconds, "repeats": a.repeats, "rows": []}
    ref = None
    for p in precisions:
        row, first, last = measure(a.codec, a.device, p, clips, a.repeats, a.batch_seconds)
        if ref is None:
            ref = first
        agree = code_agreement(ref, last if p == "float32" else first)
        row["agreement_with_float32"] = agree.as_dict()
        row["agreement_of"] = ("float32's first vs last pass" if p == "float32"
                               else "first pass vs float32's first")
        row["run_to_run"] = code_agreement(first, last).as_dict()
        result["rows"].append(row)
        print(json.dumps({k: row[k] for k in ("precision", "audio_s_per_s", "seconds")}
                         | {"overall": agree.overall}), flush=True)
    base = result["rows"][0]["audio_s_per_s"]
    for row in result["rows"]:
        row["speedup"] = round(row["audio_s_per_s"] / base, 3)
    result["load_average_1min"] = [round(load1, 2), round(os.getloadavg()[0], 2)]
    Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    print(table(result))
    print(f"wrote {a.out}")


def table(result: dict) -> str:
    n = len(result["rows"][0]["agreement_with_float32"]["per_codebook"])
    head = ["precision", "trunk", "audio-s/s", "speed-up", "codes = float32 (overall)", "frames all equal",
            *[f"cb{k}{' (semantic)' if k == 0 else ''}" for k in range(n)]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in result["rows"]:
        g = r["agreement_with_float32"]
        lines.append("| " + " | ".join([
            r["precision"],
            r["trunk_dtype"] + (" + TF32" if r["precision"] == "tf32" and r["split_path"] else ""),
            f"{r['audio_s_per_s']:,.1f}", f"{r['speedup']:.2f}x", f"{g['overall']:.2%}", f"{g['frames']:.2%}",
            *[f"{v:.2%}" for v in g["per_codebook"]]]) + " |")
    return "\n".join(lines)


def cmd_report(a: argparse.Namespace) -> None:
    result = json.loads(Path(a.json).read_text())
    r0 = result["rows"][0]
    clock = ("device time (CUDA events of the encode batches)" if r0["clock"] == "cuda-events"
             else "wall clock")
    secs = result["clip_seconds"]
    text = (f"\n## codec precision {result['date']} — {result['machine']}\n\n"
            f"`bench_codec_precision.py` (raw: `{Path(a.json).name}`): codec `{result['codec']}` on "
            f"`{result['device']}`, {result['clips']} clips of {min(secs)}–{max(secs)} s joined from "
            f"{result['utterances']} espeak-ng utterances at 24 kHz, ≤ {result['codec_batch_seconds']} s of "
            f"padded audio per forward; {result['repeats']} timed passes after a warm-up, {clock}. "
            "Agreement = share of codes identical to float32's (cb0 = the semantic codebook; the float32 "
            "row compares its own first and last pass). tf32/bf16 apply to the encoder's trunk; the "
            "resampler and the residual codebooks' nearest-code search stay float32.\n\n"
            + table(result) + "\n")
    if a.note:
        text += f"\n{a.note}\n"
    print(text)
    if not a.no_record:
        with RESULTS.open("a", encoding="utf-8") as fh:
            fh.write(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu")
    r.add_argument("--codec", default="s2-pro",
                   help="a codec.pth (or its folder), or a random-weight preset: tiny, s2-pro")
    r.add_argument("--corpus", required=True,
                   help="folder with manifest.jsonl + audio (espeak-ng; synthesized there if missing)")
    r.add_argument("--utterances", type=int, default=40, help="utterances read (or synthesized)")
    r.add_argument("--clips", type=int, default=16)
    r.add_argument("--clip-seconds", type=float, default=10.0)
    r.add_argument("--precisions", default="float32,tf32,bf16", help="float32 first")
    r.add_argument("--repeats", type=int, default=5, help="timed passes over all clips")
    r.add_argument("--batch-seconds", type=float, default=240.0, help="the stage's codecBatchSeconds")
    r.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    r.add_argument("--note", default="", help="added to the machine description (e.g. 'shared VM')")
    r.add_argument("--out", default="codec_precision.json")
    p = sub.add_parser("report")
    p.add_argument("json")
    p.add_argument("--note", default="", help="a paragraph appended under the table")
    p.add_argument("--no-record", action="store_true", help="print only; RESULTS.md is left alone")
    a = ap.parse_args()
    cmd_run(a) if a.cmd == "run" else cmd_report(a)


if __name__ == "__main__":
    main()
