"""The codec stage's encode per configuration: speed, and how many codes stay equal to the default's.

Configurations (issue #25): ``codecPrecision`` {float32, tf32, bf16} x ``codecLayout`` {ncl,
channels-last} x Snake {unfused expression, fused kernel, fused kernel + the residual units' fused
convs (channels-last only)} (x cuDNN autotuner, ``--autotune``), each
through the stage's own :class:`~ttsfleet.fill_jobs.tokenize.BatchEncoder` (one codec load per
precision; layout and kernels switched in place). The reference, measured first whatever is asked,
is the fill job's default encode: float32, NCL, unfused, autotuner off. Per configuration: one
warm-up pass, then ``--repeats`` timed passes, each timed alone (device time from the stage's CUDA
events on a GPU, synchronized wall clock on the CPU): audio-s/s from their median; then one pass at
20 % shorter lengths (new batch shapes: what a job pays when its shapes change, the autotuner timing
them again). Agreement (:func:`~ttsfleet.fill_jobs.tokenize.code_agreement`): the share of codes
equal to the reference's, per codebook (``cb0`` = the semantic codebook), overall and per frame (all
codebooks equal); the reference's own row compares its first and last pass (run-to-run determinism,
the floor the other rows are read against). The JSON is rewritten after every row (a run cut by its
time limit keeps the rows done), with the date and the machine.

Clips: ``--corpus synthetic`` (default; speech-like harmonics, noise bursts and pauses made here: the
device has no espeak-ng) or a small espeak-ng corpus (a ``manifest.jsonl`` with ``audio`` paths, as
``ttsfleet fill corpus DIR -n 40`` writes it; made in ``--corpus`` when it has none and espeak-ng is
installed), joined into ``--clips`` clips of about ``--clip-seconds``.

Random weights say nothing about the real codec's agreement (its distances to the codebook entries
are distributed differently): the figure that matters needs ``--codec /models/codec.pth``.

    python3 -P benchmarks/fill_jobs/bench_codec_precision.py run --device cuda --codec s2-pro \\
        --clips 16 --clip-seconds 10 --out codec_encode.json     # all 12 (+ reference) rows
    python3 -P benchmarks/fill_jobs/bench_codec_precision.py run --device cpu --codec tiny \\
        --threads 1 --out codec_encode.json                       # CPU smoke: 2 x 1.5 s clips, < 60 s
    python3 -P benchmarks/fill_jobs/bench_codec_precision.py report codec_encode.json [--no-record]
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


def synthetic_clips(n: int, seconds: float) -> list[np.ndarray]:
    """``n`` speech-like clips without a corpus (the device has no espeak-ng): a voiced source (seven
    harmonics of a moving pitch) under a syllable envelope, noise bursts (fricatives), pauses, gain
    varied per clip; lengths as :func:`make_clips`'s. The same every run."""
    rng = np.random.default_rng(0)
    clips = []
    for i in range(n):
        m = int((seconds + 0.37 * (i % 3)) * RATE)
        t = np.arange(m) / RATE
        f0 = 120 + 50 * np.sin(2 * np.pi * 0.4 * t + i) + 15 * np.sin(2 * np.pi * 3.1 * t)
        phase = 2 * np.pi * np.cumsum(f0) / RATE
        voiced = sum(np.sin(k * phase) / k for k in range(1, 8))
        syll = np.clip(np.sin(2 * np.pi * (3.5 + 0.3 * (i % 4)) * t + rng.uniform(0, 6)), 0, None)
        bursts = (np.sin(2 * np.pi * 1.3 * t + i) > 0.85) * rng.standard_normal(m) * 0.3
        pause = np.sin(2 * np.pi * 0.25 * t + rng.uniform(0, 6)) > -0.7  # a pause every few seconds
        y = (0.3 * voiced * syll + bursts) * pause * 10 ** (rng.uniform(-6, 3) / 20)
        y = y + 10 ** (-55 / 20) * rng.standard_normal(m)
        clips.append(np.clip(y, -1, 1).astype(np.float32))
    return clips


#: The fill job's default encode (float32 NCL, expression Snake, heuristic cuDNN kernels): every
#: row's agreement is measured against its codes, and its speed is the 1.00x.
REFERENCE = {"precision": "float32", "layout": "ncl", "snake": "unfused", "autotune": "off", "graphs": "off"}
#: ``--snakes`` values: the five-op expression, the fused Snake kernel, and that plus the residual
#: units' fused convs (``BatchEncoder(units="fused")``).
SNAKES = ("unfused", "fused", "fused-units")


def configs(precisions: list[str], layouts: list[str], snakes: list[str], autotunes: list[str],
            device: str, graphs: tuple[str, ...] = ("off",)) -> list[dict]:
    """The reference first, then every (precision, layout, snake, autotune, graphs) asked for, in
    that order, ``auto`` resolved as the stage resolves it on ``device`` (a configuration is
    measured once). Snake ``fused-units``: the fused Snakes and the residual units' fused convs,
    which address channels-last rows only (so with the ``channels-last`` layout only). Graphs
    ``on``: each bucketed batch shape replayed from a CUDA graph (``BatchEncoder(graphs=True)``;
    eager where the shapes are not bucketed, i.e. the autotuner off, or off CUDA: the row says)."""
    import torch
    from ttsfleet.fill_jobs.tokenize import default_autotune

    dev = torch.device(device)
    rows = [dict(REFERENCE)]
    for p in precisions:
        for lay in layouts:
            for sn in snakes:
                if sn == "fused-units" and lay != "channels-last":
                    continue
                for at in autotunes:
                    if at == "auto":
                        at = "on" if default_autotune(dev, p, lay) else "off"
                    for gr in graphs:
                        c = {"precision": p, "layout": lay, "snake": sn, "autotune": at, "graphs": gr}
                        if c not in rows:
                            rows.append(c)
    return rows


def _sync(enc) -> None:  # noqa: ANN001
    if enc.device.type == "cuda":
        import torch

        torch.cuda.synchronize(enc.device)


def measure(enc, config: dict, clips: list[np.ndarray], repeats: int,  # noqa: ANN001
            progress=None) -> tuple[dict, list[np.ndarray], list[np.ndarray]]:  # noqa: ANN001
    """One configuration on a loaded :class:`BatchEncoder`: a warm-up pass (cuDNN's autotuner, lazy
    inits, Triton compiles), ``repeats`` timed passes (each its own time: device time from the
    stage's CUDA events on a GPU, synchronized wall clock on the CPU; the median is reported), then
    one pass at new lengths (every clip 20 % shorter: new shapes, for the autotuner to time again),
    the cost a job pays whenever its batch shapes change. Codes from the first and last timed pass."""
    enc.configure(config["layout"], config["snake"] != "unfused", config["autotune"] == "on",
                  units="fused" if config["snake"] == "fused-units" else "cudnn",
                  graphs=config.get("graphs") == "on")
    cuda = enc.device.type == "cuda"
    audio_s = sum(len(c) for c in clips) / RATE

    def one_pass(xs: list[np.ndarray]) -> tuple[float, float, list[np.ndarray]]:
        _sync(enc)
        g0, t0 = enc.gpu_seconds, time.perf_counter()
        codes = enc.encode(xs)
        _sync(enc)
        wall = time.perf_counter() - t0
        return (enc.gpu_seconds - g0 if cuda else wall), wall, codes

    warm, _, _ = one_pass(clips)
    if progress is not None:
        progress.update(1)
    times, walls, first, last = [], [], None, None
    for _ in range(repeats):
        t, w, codes = one_pass(clips)
        times.append(t)
        walls.append(w)
        first = codes if first is None else first
        last = codes
        if progress is not None:
            progress.update(1)
    shorter = [c[: int(len(c) * 0.8)] for c in clips]
    new_shape, _, _ = one_pass(shorter)
    if progress is not None:
        progress.update(1)
    med = float(np.median(times))
    row = dict(config) | {
        "clock": "cuda-events" if cuda else "wall", "passes": repeats,
        "audio_seconds_per_pass": round(audio_s, 3),
        "pass_seconds": [round(t, 5) for t in times], "median_pass_s": round(med, 5),
        "median_wall_s": round(float(np.median(walls)), 5),
        "audio_s_per_s": round(audio_s / med, 2),
        "warmup_pass_s": round(warm, 4),
        "new_shape_pass_s": round(new_shape, 4),
        "new_shape_vs_median": round(new_shape / (0.8 * med), 2),
        "trunk_dtype": str(enc.trunk_dtype).removeprefix("torch."), "split_path": enc.split,
        "snake_backend": enc.snake_backend, "units_backend": enc.units_backend, "autotuner": enc.autotune,
        "graphs_backend": enc.graphs_backend,
        "bucket_shapes": enc.bucket_shapes}
    if cuda:
        import torch

        row["max_memory_allocated_gib"] = round(torch.cuda.max_memory_allocated(enc.device) / 2**30, 2)
        torch.cuda.reset_peak_memory_stats(enc.device)
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


def _progress(total: int, device: str):  # noqa: ANN202
    """A tqdm bar on stderr (passes done) on a terminal; None where tqdm is missing or stderr is a
    file (a device log: each row's line is the progress there)."""
    import sys

    try:
        from tqdm import tqdm
    except ImportError:
        return None
    if not sys.stderr.isatty():
        return None
    return tqdm(total=total, desc=f"encode passes ({device})", unit="pass", mininterval=1.0)


def _list(text: str, allowed: tuple[str, ...], flag: str) -> list[str]:
    values = [v.strip() for v in text.split(",") if v.strip()]
    bad = [v for v in values if v not in allowed]
    if bad or not values:
        raise SystemExit(f"{flag}: {', '.join(bad) or 'nothing'} not among {', '.join(allowed)}")
    return values


def cmd_run(a: argparse.Namespace) -> None:
    from ttsfleet.fill_jobs.tokenize import LAYOUTS, PRECISIONS, BatchEncoder, code_agreement

    if a.threads:
        import torch

        torch.set_num_threads(a.threads)
    cpu = a.device == "cpu"
    n_clips = a.clips or (2 if cpu else 16)
    clip_s = a.clip_seconds or (1.5 if cpu else 10.0)
    repeats = a.repeats or (2 if cpu else 5)
    matrix = configs(_list(a.precisions, PRECISIONS, "--precisions"), _list(a.layouts, LAYOUTS, "--layouts"),
                     _list(a.snakes, SNAKES, "--snakes"),
                     _list(a.autotune, ("auto", "on", "off"), "--autotune"), a.device,
                     tuple(_list(a.graphs, ("off", "on"), "--graphs")))
    if a.corpus == "synthetic":
        utts, clips = [], synthetic_clips(n_clips, clip_s)
    else:
        utts = utterances(Path(a.corpus), a.utterances)
        clips = make_clips(utts, n_clips, clip_s)
    load1 = os.getloadavg()[0]
    result = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "machine": machine(a.device, a.note), "device": a.device, "codec": a.codec, "clips": len(clips),
              "clip_seconds": [round(len(c) / RATE, 2) for c in clips], "utterances": len(utts),
              "corpus": "synthetic" if a.corpus == "synthetic" else "espeak-ng",
              "codec_batch_seconds": a.batch_seconds, "repeats": repeats, "reference": REFERENCE,
              "rows": []}
    encoders: dict[str, BatchEncoder] = {}
    ref = None
    bar = _progress(len(matrix) * (repeats + 2), a.device)
    for config in matrix:
        p = config["precision"]
        if p not in encoders:  # one codec load per precision; layouts and kernels switch in place
            encoders.clear()  # free the previous precision's codec first
            _free(a.device)
            t0 = time.perf_counter()
            encoders[p] = BatchEncoder(a.codec, RATE, a.device, a.batch_seconds, p)
            load_s = round(time.perf_counter() - t0, 2)
        row, first, last = measure(encoders[p], config, clips, repeats, bar)
        row["load_s"] = load_s
        if ref is None:
            ref = first
        is_ref = config == REFERENCE
        agree = code_agreement(ref, last if is_ref else first)
        row["agreement_with_reference"] = agree.as_dict()
        row["agreement_of"] = ("the reference's first vs last pass" if is_ref
                               else "first pass vs the reference's first")
        row["run_to_run"] = code_agreement(first, last).as_dict()
        result["rows"].append(row)
        _finish(result, load1)
        Path(a.out).write_text(json.dumps(result, indent=1) + "\n")  # after every row: a cut run keeps them
        msg = (f"{_label(row)}: {row['audio_s_per_s']:,.1f} audio-s/s, codes = reference "
               f"{agree.overall:.2%}")
        print(msg, flush=True) if bar is None else bar.write(msg)
    if bar is not None:
        bar.close()
    print(table(result))
    print(f"wrote {a.out}")


def _free(device: str) -> None:
    if device.startswith("cuda"):
        import gc

        import torch

        gc.collect()
        torch.cuda.empty_cache()


def _finish(result: dict, load1: float) -> None:
    base = result["rows"][0]["audio_s_per_s"]
    for row in result["rows"]:
        row["speedup"] = round(row["audio_s_per_s"] / base, 3)
    result["load_average_1min"] = [round(load1, 2), round(os.getloadavg()[0], 2)]


def _label(r: dict) -> str:
    return (f"{r['precision']} {r.get('layout', 'ncl')} {r.get('snake', 'unfused')} "
            f"autotune={r.get('autotune', 'off')} graphs={r.get('graphs', 'off')}")


def table(result: dict) -> str:
    """Markdown, one row per configuration (older results, without layout / kernels, as ncl rows)."""
    rows = result["rows"]
    key = "agreement_with_reference" if "agreement_with_reference" in rows[0] else "agreement_with_float32"
    n = len(rows[0][key]["per_codebook"])
    head = ["precision", "layout", "Snake", "residual units", "cuDNN autotuner", "graphs", "audio-s/s",
            "speed-up", "new shape", "codes = ref (overall)", "frames all equal",
            *[f"cb{k}{' (semantic)' if k == 0 else ''}" for k in range(n)]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        g = r[key]
        trunk = r["trunk_dtype"] + (" + TF32" if r["precision"] == "tf32" and r["split_path"] else "")
        snake = r.get("snake_backend", "expression")
        tuner = r.get("autotuner")
        tuned = "-" if tuner is None else "off" if not tuner else (
            "on, bucketed" if r.get("bucket_shapes") else "on")
        lines.append("| " + " | ".join([
            f"{r['precision']} ({trunk})", r.get("layout", "ncl"),
            "expression" if snake == "expression" else f"fused ({snake})",
            r.get("units_backend", "cudnn"), tuned, r.get("graphs_backend", "eager"),
            f"{r['audio_s_per_s']:,.1f}", f"{r['speedup']:.2f}x",
            f"{r['new_shape_vs_median']:.1f}x" if "new_shape_vs_median" in r else "-",
            f"{g['overall']:.2%}", f"{g['frames']:.2%}",
            *[f"{v:.2%}" for v in g["per_codebook"]]]) + " |")
    return "\n".join(lines)


def cmd_report(a: argparse.Namespace) -> None:
    result = json.loads(Path(a.json).read_text())
    r0 = result["rows"][0]
    clock = ("device time (CUDA events of the encode batches)" if r0["clock"] == "cuda-events"
             else "wall clock")
    secs = result["clip_seconds"]
    source = ("synthetic speech-like clips (no corpus)" if result.get("corpus") == "synthetic"
              else f"clips joined from {result['utterances']} espeak-ng utterances")
    ref = result.get("reference", {"precision": "float32", "layout": "ncl"})
    smoke = (", CPU smoke (says nothing about GPU speed)" if result["device"] == "cpu" else "")
    text = (f"\n## codec encode{smoke} {result['date']} — {result['machine']}\n\n"
            f"`bench_codec_precision.py` (raw: `{Path(a.json).name}`): codec `{result['codec']}` on "
            f"`{result['device']}`, {result['clips']} {source} of {min(secs)}–{max(secs)} s at 24 kHz, "
            f"≤ {result['codec_batch_seconds']} s of padded audio per forward; audio-s/s from the median "
            f"of {result['repeats']} timed passes after a warm-up, {clock}. New shape = one pass at "
            "lengths 20 % shorter (new batch shapes) over a timed pass's time per audio second: what a "
            "change of batch shape costs (the autotuner times it again). Agreement = share of codes "
            f"identical to the reference's ({', '.join(f'{k} {v}' for k, v in ref.items())}: the fill "
            "job's default; its row compares its own first and last pass; cb0 = the semantic codebook). "
            "tf32/bf16 apply to the encoder's trunk; the resampler and the residual codebooks' "
            "nearest-code search stay float32.\n\n"
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
    r.add_argument("--corpus", default="synthetic",
                   help="folder with manifest.jsonl + audio (espeak-ng; synthesized there if missing), "
                        "or 'synthetic': speech-like clips made here (no espeak-ng needed)")
    r.add_argument("--utterances", type=int, default=40, help="utterances read (or synthesized)")
    r.add_argument("--clips", type=int, default=0, help="0: 16 on a GPU, 2 on the CPU")
    r.add_argument("--clip-seconds", type=float, default=0.0, help="0: 10 on a GPU, 1.5 on the CPU")
    r.add_argument("--precisions", default="float32,tf32,bf16")
    r.add_argument("--layouts", default="ncl,channels-last", help="the encoder's conv layouts")
    r.add_argument("--snakes", default="unfused,fused",
                   help="Snake as the torch expression (unfused) or the fused kernel (fused), or that "
                        "with the residual units' convs fused too (fused-units; channels-last rows only)")
    r.add_argument("--autotune", default="auto",
                   help="cuDNN autotuner: auto (the stage's default: on off the bit-exact path, on "
                        "CUDA), on, off, or a list (auto,off)")
    r.add_argument("--graphs", default="off",
                   help="each bucketed batch shape's encode from a CUDA graph: off, on, or off,on")
    r.add_argument("--repeats", type=int, default=0, help="timed passes over all clips (0: 5 on a GPU, "
                                                          "2 on the CPU)")
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
