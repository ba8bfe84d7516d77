"""Where a batched streaming codec push spends its GPU time, and what torch.compile buys (issue #25).

The serving codec (bf16, fused Snake, every (streams, frames) shape replayed from a CUDA graph)
costs 27.0 ms per 64 streams x 4 frames push on the H200 (2026-12-02); the issue's target is 8.5 ms.
This script measures, in one process, side by side on the same random S2-size codec:

- ``graphs``: the serving path as it is (the baseline);
- ``compiled``: the serving decoder with ``compile_mode="default"`` (``ttsfleet serve --codec-compile
  default``): Inductor fuses the elementwise work around the convolutions (bias adds, residual adds,
  Snake, the causal history concatenations), with symbolic shapes (four compiles serve every
  streams x frames shape a server captures), then the same bucketed CUDA graphs record it;
- ``compiled-static``: the eager decode wrapped with fixed shapes (one compile per shape: what the
  symbolic compile gives up, if anything);
- ``compiled-autotune``: Inductor's ``max-autotune-no-cudagraphs`` (Triton conv and
  GEMM templates raced against cuDNN / cuBLAS; long to compile);
- ``fused-units``: the serving path with the residual units' convs as Triton implicit GEMMs, the
  second Snake and the residual add in their epilogues (``TTSFLEET_CODEC_UNITS=fused``,
  :meth:`~ttsfleet.inference.codec.Codec.use_fused_units`), for the units
  :meth:`~ttsfleet.inference.codec_layers.ResidualUnit.takes_fused` admits, then the same graphs;
  ``fused-units-all``: every unit fused (the width and row limits lifted);
- ``strided-window``: the serving path with the window transformer's old strided input
  (:attr:`~ttsfleet.inference.codec_layers.WindowTransformer.dense_input` False), for the side by side;
- any variant with ``+window-NAME`` (``auto``: torch's choice, ``cudnn``, ``efficient``, ``flash``,
  ``math``): the window transformer's attention on that SDPA backend in the pushes
  (:attr:`~ttsfleet.inference.codec_layers.WindowTransformer.slot_sdpa`), e.g. ``graphs+window-math``;
  without one, the served backend (``TTSFLEET_CODEC_WINDOW_ATTENTION``: ``efficient`` on CUDA since
  2026-12-05c, torch's choice on the CPU);
- any variant with ``@table``: the same with the fused convs' tiles of ``--tile-table FILE`` (a
  ``codec_tiles.py`` sweep's table) pinned while its graphs are captured and timed, e.g.
  ``fused-units@table`` beside ``fused-units`` (the shipped table, else the heuristic).

For each: compile + capture seconds per shape, ms per push (CUDA events, median of ``REPS``),
frames/s, and the audio's SNR against the baseline and against a float32 eager decode of the same
codes over 8 consecutive 4-frame pushes of 16 streams (the state carried between pushes is part of
what is compared). With ``--profile`` the kernels of
three 64 x 4 pushes are summed by category (torch.profiler).

Usage on the device: ``python3 -m benchmarks.inference_h200.codec_compile OUT.json [--variants ...]
[--profile] [--layout ncl|channels-last]`` (the served channels-last layout by default on CUDA, the
server's cuDNN autotuner setting); on a CPU ``--device cpu --codec tiny`` checks the script (timings
meaningless). Where today's push goes: ``CC_ARGS="--variants graphs --shapes 64x4,128x4"
speed_run.sh codeccompile`` (``--profile`` is always passed there).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict
from typing import Any

import torch
from ttsfleet.inference.bench_engine import call_ms
from ttsfleet.inference.codec import load_codec
from ttsfleet.inference.codec_batch import use_conv_autotuner
from ttsfleet.inference.codec_layers import ResidualUnit, WindowTransformer
from ttsfleet.kernels.codec_conv_tiles import pin_tiles, read_table

SHAPES = ((1, 1), (16, 4), (64, 4), (128, 4))
REPS = 20


def make_decoder(codec, variant: str, slots: int) -> Any:  # noqa: ANN001
    """The serving decoder of ``variant``: compiled ones through ``slot_decoder(compile_mode=...)``,
    exactly as ``ttsfleet serve --codec-compile MODE`` builds it (symbolic shapes, state marked
    static, Snake traced in float32); ``compiled-static`` wraps the eager decode with fixed shapes
    (one compile per shape: the ceiling the symbolic one is compared with)."""
    codec.use_fused_units(variant.startswith("fused-units"))
    every = variant == "fused-units-all"
    for unit in codec.decoder.modules():
        if isinstance(unit, ResidualUnit):  # instance attributes: the class's limits, or none
            unit.fused_max_width = 1 << 20 if every else ResidualUnit.fused_max_width
            unit.fused_min_rows = 0 if every else ResidualUnit.fused_min_rows
    WindowTransformer.dense_input = variant != "strided-window"
    if variant in ("graphs", "compiled-static", "fused-units", "fused-units-all", "strided-window"):
        dec = codec.slot_decoder(slots, max_frames=4096, graphs=True, graph_max_batch=slots)
        if variant == "compiled-static":  # one eager call first: every state tensor exists
            dev = codec.device
            dec._decode_eager(torch.arange(slots, slots + 1, device=dev),
                              torch.zeros(1, codec.num_codebooks, 1, dtype=torch.long, device=dev))
            dec.state.reset(slots)
            dec.compiled = torch.compile(dec._decode_eager, dynamic=False)
        return dec
    mode = "max-autotune-no-cudagraphs" if variant == "compiled-autotune" else "default"
    return codec.slot_decoder(slots, max_frames=4096, graphs=True, graph_max_batch=slots, compile_mode=mode)


def parse_variant(variant: str, have_table: bool) -> tuple[str, str | None, bool]:
    """``NAME[+window-BACKEND][@table]`` -> (NAME, the window backend or None, whether the table's
    tiles are pinned); a modifier it does not know, or ``@table`` without ``--tile-table``, stops
    the run before any work (a typo would otherwise time the plain variant under another name)."""
    named, _, suffix = variant.partition("@")
    base, *mods = named.split("+")
    if suffix and (suffix != "table" or not have_table):
        raise SystemExit(f"variant {variant}: pass --tile-table FILE")
    if any(not m.startswith("window-") for m in mods) or len(mods) > 1:
        raise SystemExit(f"variant {variant}: the one modifier is +window-BACKEND")
    return base, mods[0].removeprefix("window-") if mods else None, bool(suffix)


def window_backend(window: str | None, dev: torch.device) -> str | None:
    """A variant's window attention backend as ``WindowTransformer.slot_sdpa`` takes it: its
    ``+window-NAME``, else the served one (:func:`~ttsfleet.inference.codec_batch.window_attention_for`),
    so a plain variant times what the server runs; ``auto`` is None (torch's choice)."""
    from ttsfleet.inference.codec_batch import window_attention_for

    name = window or window_attention_for(dev)
    return None if name == "auto" else name


def push_ms(dec, b: int, t: int, codes: torch.Tensor) -> float:  # noqa: ANN001
    slots = list(range(b))
    dev = dec.codec.device
    for _ in range(3):
        dec.push(slots, codes[:b, :, :t])
    return statistics.median(call_ms(lambda: dec.push(slots, codes[:b, :, :t]), dev) for _ in range(REPS))


def stream_audio(dec, codes: torch.Tensor, pushes: int = 8, step: int = 4) -> torch.Tensor:  # noqa: ANN001
    slots = list(range(codes.shape[0]))
    for s in slots:
        dec.reset(s)
    parts = [dec.push(slots, codes[:, :, i * step:(i + 1) * step]).float().clone() for i in range(pushes)]
    return torch.cat(parts, dim=1)


def float32_audio(name: str, dev: torch.device, codes: torch.Tensor) -> torch.Tensor:
    """The reference: float32 weights, eager, TF32 off, same pushes."""
    tf32 = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        codec = load_codec(name, device=dev, dtype=torch.float32)
        return stream_audio(codec.slot_decoder(codes.shape[0], max_frames=4096), codes)
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = tf32


def snr_db(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float(10 * torch.log10(ref.pow(2).sum() / (x - ref).pow(2).sum().clamp_min(1e-30)))


CATEGORIES = (("conv", ("conv", "cudnn", "implicit", "sm90_xmma", "fprop", "dgrad", "wgrad")),
              ("gemm", ("gemm", "cutlass", "matmul", "nvjet", "splitk")),
              ("triton", ("triton",)), ("copy/cat", ("copy", "cat", "index", "gather", "scatter")),
              ("elementwise", ("elementwise", "vectorized", "unrolled", "reduce")))


def categorize(name: str) -> str:
    low = name.lower()
    return next((c for c, keys in CATEGORIES if any(k in low for k in keys)), "other")


def profile(dec, codes: torch.Tensor, b: int = 64, t: int = 4) -> dict[str, Any]:  # noqa: ANN001
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof

    slots = list(range(b))
    with prof(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(3):
            dec.push(slots, codes[:b, :, :t])
        torch.cuda.synchronize()
    by_cat: dict[str, float] = defaultdict(float)
    top = []
    for ev in p.key_averages():
        us = ev.device_time_total if hasattr(ev, "device_time_total") else ev.cuda_time_total
        if us <= 0:
            continue
        by_cat[categorize(ev.key)] += us / 3 / 1000
        top.append((us / 3 / 1000, ev.count // 3, ev.key[:90]))
    top.sort(reverse=True)
    return {"ms_by_category": {k: round(v, 3) for k, v in sorted(by_cat.items(), key=lambda kv: -kv[1])},
            "top": [{"ms": round(ms, 3), "calls": n, "kernel": k} for ms, n, k in top[:15]]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--codec", default="s2-pro")
    ap.add_argument("--variants", default="graphs,compiled,compiled-static",
                    help="comma list of graphs, compiled, compiled-static, compiled-autotune, fused-units, "
                         "fused-units-all, strided-window; NAME+window-BACKEND: the window attention on that "
                         "SDPA backend; NAME@table: with --tile-table's tiles")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--shapes", default=",".join(f"{b}x{t}" for b, t in SHAPES))
    ap.add_argument("--tile-table", default=None, help="the tiles of the @table variants (codec_tiles.py's)")
    ap.add_argument("--layout", choices=("ncl", "channels-last"), default=None,
                    help="the decoder's conv layout (default: channels-last on CUDA, the H200's served one)")
    args = ap.parse_args()
    dev = torch.device(args.device)
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    slots = max(b for b, _ in shapes)
    if dev.type == "cuda":
        use_conv_autotuner()  # as the server's codec (3 candidates per conv shape)
        torch.cuda.set_stream(torch.cuda.Stream(dev))  # as the engine's codec thread
    variants = args.variants.split(",")
    parsed = [parse_variant(v, args.tile_table is not None) for v in variants]  # all, before any work
    layout = args.layout or ("channels-last" if dev.type == "cuda" else "ncl")
    codec = load_codec(args.codec, device=dev, fast=True, channels_last=layout == "channels-last")
    gen = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 1000, (slots, codec.num_codebooks, 64), generator=gen)
    report: dict[str, Any] = {"device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
                              "torch": torch.__version__, "codec": args.codec, "layout": layout,
                              "variants": {}}
    audio: dict[str, torch.Tensor] = {}
    table = read_table(args.tile_table) if args.tile_table else None
    for v, (base, window, tiled) in zip(variants, parsed, strict=True):
        pin_tiles(table if tiled else None)  # before the capture: the graphs keep the tiles they launched
        WindowTransformer.slot_sdpa = window_backend(window, dev)
        dec = make_decoder(codec, base, slots)
        row: dict[str, Any] = {"capture_s": {}, "push": []}
        for b, t in shapes:
            t0 = time.perf_counter()
            if dec.use_graphs:
                dec._graph(dec.bucket(b), t)
            else:  # no graphs (CPU): the first calls compile
                push_ms(dec, b, t, codes)
            row["capture_s"][f"{b}x{t}"] = round(time.perf_counter() - t0, 2)
        for b, t in shapes:
            ms = push_ms(dec, b, t, codes)
            row["push"].append({"streams": b, "frames": t, "ms": round(ms, 3),
                                "frames_per_s": round(b * t / ms * 1000)})
            print(v, row["push"][-1], "capture", row["capture_s"][f"{b}x{t}"], "s", flush=True)
        n = min(16, slots)
        audio[v] = stream_audio(dec, codes[:n])
        if args.profile and dev.type == "cuda" and any(b == 64 for b, _ in shapes):
            row["profile_64x4"] = profile(dec, codes)
            print(v, json.dumps(row["profile_64x4"]["ms_by_category"]), flush=True)
            for k in row["profile_64x4"]["top"][:8]:  # which convolutions cost what (the next lever)
                print(f"  {k['ms']:7.3f} ms  x{k['calls']:<4} {k['kernel']}", flush=True)
        report["variants"][v] = row
        _write(args.out, report)  # after every variant: a stage cut by its time cap keeps what it has
        del dec
        pin_tiles(None)
        WindowTransformer.slot_sdpa = None
    ref = float32_audio(args.codec, dev, codes[:min(16, slots)])
    for v in variants:
        row = report["variants"][v]
        row["snr_db_vs_float32"] = round(snr_db(audio[v], ref), 2)
        if v != variants[0]:
            row[f"snr_db_vs_{variants[0]}"] = round(snr_db(audio[v], audio[variants[0]]), 2)
    print("\n| variant | " + " | ".join(f"{b}x{t} ms" for b, t in shapes)
          + f" | compile+capture s | SNR vs float32 dB | SNR vs {variants[0]} dB |")
    print("|---|" + "---:|" * (len(shapes) + 3))
    for v, row in report["variants"].items():
        cells = " | ".join(f"{p['ms']:.2f}" for p in row["push"])
        cap = sum(row["capture_s"].values())
        vs_first = row.get(f"snr_db_vs_{variants[0]}", "-")
        print(f"| {v} | {cells} | {cap:.0f} | {row['snr_db_vs_float32']} | {vs_first} |")
    _write(args.out, report)


def _write(path: str | None, report: dict[str, Any]) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
