"""Where one batched streaming push of the serving codec spends GPU time, stage by stage, against
each stage's own floor (issue #25: a 64 x 4 push in <= 8.5 ms; 14.7-14.9 ms on the H200 in 2026-12-04's
runs, bf16, channels-last, fused Snake, CUDA graphs).

Why: the codec's miss is measured only as whole pushes, as every conv of a push together
(`codec_convs.py`: 5.93 ms of a 64 x 4 push on 2026-12-03) and as a kernel list of an older decoder
(`2026-12-01-probe/codec_profile_bf16.txt`). A per-stage table says which stage is far from what its
arithmetic and its bytes allow, so the next fusion goes where the time is.

Per stage (the quantizer's window transformer, each of its upsampling transposed convs and ConvNeXt
blocks, each upsampling block of the decoder; the rest of the push — RVQ decode, the decoder's first
conv, its last Snake + conv + tanh, the layout conversion — as one remainder): GPU ms of an eager push
between CUDA events recorded at the stage's forward hooks (median over the pushes; at a 64 x 4 push the
GPU work outlasts the launches, while a stage of kernels shorter than their launches would read its
launch time), FLOPs (torch's
``FlopCounterMode`` over one more push), the least HBM bytes (the stage's parameters and its input and
output, once), and the floors those give at two ceilings measured in the same process: a bf16 GEMM's
rate (8192^3, cuBLAS) and the device-to-device copy bandwidth. Then the whole push eager and replayed
from a CUDA graph (what the server runs): their difference is what launches cost.

Usage (device, repo root; the serving codec of an H200: bf16, fused Snake, channels-last):
``python3 -m benchmarks.inference_h200.codec_stages OUTDIR [--streams 64 --frames 4 --layout channels-last]``
writes ``codec_stages.json`` and ``codec_stages.png``. Without CUDA it runs the tiny codec on the CPU:
a check of the harness (``tests/inference_model/test_codec_stages_bench.py``), not a measurement.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from ttsfleet.inference.bench_module_stages import (
    ceilings,
    median_call_ms,
    print_stage_rows,
    stage_table,
)
from ttsfleet.inference.codec import load_codec
from ttsfleet.inference.codec_batch import use_conv_autotuner
from ttsfleet.inference.codec_layers import SeqBlock

#: The row that takes whatever the hooked stages leave of the push.
REST = "rest (RVQ decode, first conv, last Snake + conv, layout)"


def codec_stages(codec: Any) -> list[tuple[str, nn.Module]]:
    """The push's stages whose forward is called as a module (so hooks see them), in push order."""
    q, dec = codec.quantizer, codec.decoder
    stages: list[tuple[str, nn.Module]] = [("quantizer.post_module", q.post_module)]
    for i, (conv, convnext) in enumerate(q.upsample):
        prefix = f"quantizer.upsample.{i}"
        stages += [(f"{prefix}.transconv", conv), (f"{prefix}.convnext", convnext)]
    return stages + [(f"decoder.model.{j}", m) for j, m in enumerate(dec.model) if isinstance(m, SeqBlock)]


def measure(codec: Any, streams: int, frames: int, reps: int, ceil: dict[str, float],
            layout: bool | None = None) -> dict[str, Any]:
    """The stage table of ``reps`` eager ``streams`` x ``frames`` pushes (after 2 warm-up pushes), the
    FLOPs of one more, and the whole push eager and (CUDA) graph-replayed."""
    cuda = codec.device.type == "cuda"
    dec = codec.slot_decoder(streams, max_frames=4096, channels_last=layout)
    gen = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 1000, (streams, codec.num_codebooks, frames), generator=gen)
    slots = list(range(streams))
    push_ms, total_flop, rows = stage_table(codec_stages(codec), lambda: dec.push(slots, codes), codec.device,
                                            reps, ceil, REST)
    return {"streams": streams, "frames": frames, "push_eager_ms": push_ms, "push_graph_ms": _graph_ms(
        codec, streams, frames, codes, layout) if cuda else None, "total_gflop": total_flop / 1e9,
        "rows": [r.as_dict() for r in rows]}


def _graph_ms(codec: Any, streams: int, frames: int, codes: torch.Tensor, layout: bool | None) -> float:
    dec = codec.slot_decoder(streams, max_frames=4096, graphs=True, channels_last=layout)
    dec.capture((frames,))
    return median_call_ms(lambda: dec.push(list(range(streams)), codes), codec.device)


def print_table(report: dict[str, Any]) -> None:
    ceil = report["ceilings"]
    print(f"{report['streams']} x {report['frames']} push: eager {report['push_eager_ms']:.2f} ms, graph "
          f"{report['push_graph_ms'] or float('nan'):.2f} ms, {report['total_gflop']:.1f} GFLOP; ceilings "
          f"{ceil['bf16_tflops']:.1f} TFLOP/s bf16, {ceil['copy_gbs']:.0f} GB/s copy")
    print_stage_rows(report["rows"])


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["rows"]
    names = [r["name"].split(" (")[0] for r in rows]
    fig, ax = plt.subplots(figsize=(9, 0.35 * len(rows) + 1.5))
    y = range(len(rows))
    ax.barh([i + 0.2 for i in y], [r["ms"] for r in rows], height=0.4, label="measured (eager push)")
    ax.barh([i - 0.2 for i in y], [r["floor_ms"] for r in rows], height=0.4, label="floor (FLOPs or bytes)")
    ax.set_yticks(list(y), names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ms per push")
    ax.set_title(f"codec push {report['streams']} x {report['frames']} on {report['device']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--frames", type=int, default=4)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--layout", choices=["ncl", "channels-last"], default="channels-last")
    args = ap.parse_args(argv)
    cuda = torch.cuda.is_available()
    if cuda:
        use_conv_autotuner()  # cuDNN's kernel choice as the server makes it
    codec = load_codec("s2-pro" if cuda else "tiny", device="cuda" if cuda else "cpu", fast=cuda)
    ceil = ceilings(codec.device)
    with torch.inference_mode():
        report = measure(codec, args.streams, args.frames, args.reps, ceil, args.layout == "channels-last")
    report |= {"device": torch.cuda.get_device_name() if cuda else "cpu (tiny codec: a harness check)",
               "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"), "layout": args.layout,
               "ceilings": ceil, "codec": "s2-pro, bf16, fused Snake" if cuda else "tiny, float32"}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "codec_stages.json").write_text(json.dumps(report, indent=1))
    print_table(report)
    plot(report, args.out / "codec_stages.png")


if __name__ == "__main__":
    main()
