"""One codec residual unit at each S2 decoder width: cuDNN convs + separate passes vs the fused
Triton convs (issue #25), and which conv tile is fastest per width.

A unit is Snake -> 7-tap dilated causal conv -> Snake -> 1x1 conv -> residual add; the decoder has
three per upsampling block (widths 768, 384, 192, 96), each run over a push's time rows. This times
one unit (dilation 3) per width on the rows of a 64-stream x 4-frame push (``--streams``,
``--frames``), bf16, channels-last, as the serving codec runs it:

- ``cudnn``: the unit as it ships (fused Snake kernel with the conv bias folded in, cuDNN convs, a
  residual add);
- ``fused``: :meth:`ResidualUnit._fused` with the tiles it would run with
  (:func:`~ttsfleet.kernels.codec_conv_tiles.tile_for`: the tuned table's, else the heuristic's);
- ``tile BTxBNxBKxWxS``: the fused unit with its two convs at that tile (``--tiles``).

Each variant's output is checked against ``cudnn``'s first (relative error, bf16), then all are
timed in alternating rounds (CUDA events, median of ``--reps`` per round, median over rounds and the
spread), plus the bytes a unit must move at least (input read, output written, once each) against
the copy bandwidth measured in the same process. Table, JSON and a PNG.

Usage (device, repo root): ``python3 -m benchmarks.inference_h200.codec_units OUT_DIR`` (``speed_run.sh
codecunits``); ``--device cpu`` checks the script with a small width on Triton's interpreter.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import torch
from ttsfleet.inference.bench_engine import call_ms
from ttsfleet.inference.codec_layers import ResidualUnit, set_fused_units
from ttsfleet.kernels.codec_conv_tiles import S2_DECODER_UNIT_ROWS_PER_FRAME, ConvTile, set_tile

WIDTHS = tuple(S2_DECODER_UNIT_ROWS_PER_FRAME)


def make_unit(width: int, dev: torch.device, dtype: torch.dtype) -> ResidualUnit:
    """A residual unit of ``width`` channels with random weights of the released codec's scale."""
    unit = ResidualUnit(width, 3).to(dev, dtype).eval().requires_grad_(False)
    g = torch.Generator().manual_seed(width)
    for p in unit.parameters():
        p.copy_((torch.randn(p.shape, generator=g) / max(1, p[0].numel()) ** 0.5).to(dtype))
    for m in unit.modules():
        if hasattr(m, "alpha"):
            m.alpha.copy_((torch.rand(m.alpha.shape, generator=g) + 0.5).to(dtype))
        if hasattr(m, "fused"):
            m.fused = True
    return unit


def run_variant(unit: ResidualUnit, x: torch.Tensor, variant: str) -> torch.Tensor:
    """One unit call as ``variant`` (the tile set for the call only)."""
    if variant == "cudnn":
        unit.fused_convs = False
        return unit(x)
    unit.fused_convs = True
    if variant == "fused":  # whatever ResidualUnit.takes_fused would say for this width and push
        return unit._fused(x, None)
    tile = ConvTile.parse(variant.split()[1])
    width = x.shape[1]
    for ksize in (7, 1):  # both convs of the unit, pinned for this call only
        set_tile(ksize, width, width, tile)
    try:
        return unit._fused(x, None)
    finally:
        for ksize in (7, 1):
            set_tile(ksize, width, width, None)


def measure(width: int, args: argparse.Namespace, dev: torch.device, variants: list[str]) -> dict[str, Any]:
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    unit = make_unit(width, dev, dtype)
    set_fused_units(unit, True)
    t = S2_DECODER_UNIT_ROWS_PER_FRAME[width] * args.frames if dev.type == "cuda" else 40
    x = torch.randn(args.streams, width, 1, t, device=dev, dtype=dtype)
    x = x.contiguous(memory_format=torch.channels_last)
    ref = run_variant(unit, x, "cudnn").float()
    row: dict[str, Any] = {"width": width, "rows": args.streams * t, "variants": {}}
    ok = []
    for v in variants:
        out = run_variant(unit, x, v).float()
        err = float((out - ref).norm() / ref.norm())
        row["variants"][v] = {"rel_err_vs_cudnn": round(err, 5), "ms_rounds": []}
        ok.append(v)
    for _ in range(args.rounds):
        for v in ok:
            call = lambda v=v: run_variant(unit, x, v)  # noqa: E731
            ms = statistics.median(call_ms(call, dev) for _ in range(args.reps))
            row["variants"][v]["ms_rounds"].append(round(ms, 4))
    for v in ok:
        r = row["variants"][v]["ms_rounds"]
        row["variants"][v].update(ms=round(statistics.median(r), 4),
                                  spread=round((max(r) - min(r)) / statistics.median(r), 4))
    row["least_bytes"] = 2 * x.numel() * x.element_size()
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--frames", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--widths", default=",".join(map(str, WIDTHS)))
    ap.add_argument("--tiles", default="128x64x64x4x3,64x64x64x4x4,128x128x64x8x3,64x128x32x4x4",
                    help="BTxBNxBKxWARPSxSTAGES tiles tried beside the default")
    args = ap.parse_args()
    dev = torch.device(args.device)
    widths = [int(w) for w in args.widths.split(",")] if dev.type == "cuda" else [16]
    tiles = [f"tile {t}" for t in args.tiles.split(",") if t] if dev.type == "cuda" else []
    variants = ["cudnn", "fused", *tiles]
    bw = None
    if dev.type == "cuda":
        from ttsfleet.kernels.bench import copy_bandwidth

        bw = round(copy_bandwidth() / 1e9, 1)  # bytes/s -> GB/s
    rows = [measure(w, args, dev, variants) for w in widths]
    report = {"device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
              "torch": torch.__version__, "streams": args.streams, "frames": args.frames,
              "copy_bandwidth_gbs": bw, "rows": rows}
    print_table(report, variants)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "codec_units.json").write_text(json.dumps(report, indent=1))
        plot(report, variants, out / "codec_units.png")


def print_table(report: dict[str, Any], variants: list[str]) -> None:
    bw = report["copy_bandwidth_gbs"]
    print(f"\none residual unit, {report['streams']} streams x {report['frames']} frames, "
          f"ms (spread; rel. error vs cudnn); copy bandwidth {bw} GB/s")
    print("| width | rows | " + " | ".join(variants) + " | bytes floor ms |")
    print("|---:|---:|" + "---:|" * (len(variants) + 1))
    for r in report["rows"]:
        cells = [f"{r['variants'][v]['ms']:.3f} ({r['variants'][v]['spread']:.0%}; "
                 f"{r['variants'][v]['rel_err_vs_cudnn']:.1e})" for v in variants]
        floor = f"{r['least_bytes'] / (bw * 1e9) * 1e3:.3f}" if bw else "-"
        print(f"| {r['width']} | {r['rows']:,} | " + " | ".join(cells) + f" | {floor} |")


def plot(report: dict[str, Any], variants: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    widths = [r["width"] for r in report["rows"]]
    step = 0.8 / len(variants)
    for i, v in enumerate(variants):
        ax.bar([j + i * step for j in range(len(widths))], [r["variants"][v]["ms"] for r in report["rows"]],
               step, label=v)
    ax.set_xticks([j + 0.4 - step / 2 for j in range(len(widths))], [f"C={w}" for w in widths])
    ax.set_ylabel("ms per unit call")
    ax.set_title(f"codec residual unit, {report['streams']} x {report['frames']} push ({report['device']})")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
