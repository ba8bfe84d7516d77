"""Where the fill job's codec encode spends GPU time, stage by stage, against each stage's floor
(issue #25: >= 1,000 audio-s per GPU-s; the best encode recorded is 685 audio-s/s in bf16 on the H200,
2026-12-01, where its FLOPs, 78.4 GFLOP per audio second, allow ~10,000).

Why: the encode is measured only whole (``bench_codec_precision.py``, a row per configuration), so
nothing says which stage holds it back. The same accounting as ``codec_stages.py``
(:mod:`ttsfleet.inference.bench_module_stages`): per stage, GPU ms between CUDA events at the
stage's forward hooks (median over the passes), its FLOPs (``FlopCounterMode``, one more pass), the
least HBM bytes (parameters, input and output, once) and the floors those give at a bf16 GEMM's
rate and the copy bandwidth measured in the same process; the rest of the pass as one remainder.

Stages: the encoder's four downsampling blocks, the quantizer's two downsampling convs and ConvNeXt
blocks, its window transformer; the rest (the encoder's first conv, its last Snake + conv, the layout
conversion, the float32 nearest-code search of every codebook) as one row. The search (11 codebooks
one after another: no module forward of its own to hook) is also timed alone on the window
transformer's output, so the remainder splits into the search and the convs around the trunk.
The encode is the fill job's own (:func:`~ttsfleet.fill_jobs.tokenize.encode_split` on a
:class:`~ttsfleet.fill_jobs.tokenize.BatchEncoder` set up as the stage sets it up: on CUDA bf16,
channels-last, the fused Snake, cuDNN's autotuner), once per ``--units`` value (the residual units'
fused Triton convs, ``fused``, or cuDNN's, ``cudnn``), side by side in one process.

Usage (device, repo root): ``python3 -m benchmarks.inference_h200.encode_stages OUTDIR [--clips 4
--seconds 10 --units fused,cudnn]`` writes ``encode_stages.json`` and a table. Without CUDA it runs the
tiny codec in float32 on the CPU: a check of the harness, not a measurement.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from ttsfleet.fill_jobs.tokenize import BatchEncoder, _autotuner, encode_split, encode_trunk, search_codes
from ttsfleet.inference.bench_module_stages import (
    ceilings,
    median_call_ms,
    print_stage_rows,
    stage_table,
)
from ttsfleet.inference.codec_layers import SeqBlock

#: The row that takes whatever the hooked stages leave of a pass.
REST = "rest (first conv, last Snake + conv, layout, float32 codebook search)"


def encode_stages(codec: Any) -> list[tuple[str, nn.Module]]:
    """The encode's stages whose forward is called as a module (so hooks see them), in pass order."""
    stages = [(f"encoder.block.{i}", m) for i, m in enumerate(codec.encoder.block) if isinstance(m, SeqBlock)]
    for i, (conv, convnext) in enumerate(codec.quantizer.downsample):
        stages += [(f"quantizer.downsample.{i}.conv", conv), (f"quantizer.downsample.{i}.convnext", convnext)]
    return [*stages, ("quantizer.pre_module", codec.quantizer.pre_module)]


def measure(enc: BatchEncoder, x: torch.Tensor, reps: int, ceil: dict[str, float]) -> dict[str, Any]:
    """The stage table of ``reps`` encodes of ``x`` ``[clips, 1, samples]`` (after 2 warm-up passes),
    the FLOPs of one more, and audio seconds per second of the whole pass."""
    codec = enc.codec

    def one() -> torch.Tensor:
        return encode_split(codec, x, enc.trunk_dtype, enc.precision == "tf32")

    with _autotuner(enc.device, enc.autotune):
        pass_ms, total_flop, rows = stage_table(encode_stages(codec), one, enc.device, reps, ceil, REST)
        search, _ = codebook_search(enc, x, reps)
    audio_s = x.shape[0] * x.shape[-1] / codec.sample_rate
    return {"units": enc.units_backend, "pass_ms": pass_ms, "audio_s": audio_s,
            "audio_s_per_s": audio_s / (pass_ms / 1000), "total_gflop": total_flop / 1e9,
            "codebook_search_ms": search, "rows": [r.as_dict() for r in rows]}


def codebook_search(enc: BatchEncoder, x: torch.Tensor, reps: int) -> tuple[float, torch.Tensor]:
    """The float32 nearest-code search of every codebook alone (:func:`search_codes`, the second half
    of :func:`encode_split`) on the trunk's latent for ``x``: median ms of ``reps`` calls, and its codes."""
    z = encode_trunk(enc.codec, x, enc.trunk_dtype, enc.precision == "tf32")

    def search() -> torch.Tensor:
        return search_codes(enc.codec, z)

    return median_call_ms(search, enc.device, reps), search()


def print_table(report: dict[str, Any]) -> None:
    ceil = report["ceilings"]
    print(f"ceilings {ceil['bf16_tflops']:.1f} TFLOP/s bf16, {ceil['copy_gbs']:.0f} GB/s copy; "
          f"{report['clips']} clips x {report['seconds']} s")
    for run in report["runs"]:
        print(f"\nunits {run['units']}: pass {run['pass_ms']:.2f} ms, {run['audio_s_per_s']:,.0f} audio-s/s, "
              f"{run['total_gflop']:.1f} GFLOP; the codebook search alone {run['codebook_search_ms']:.3f} ms")
        print_stage_rows(run["rows"], name_width=70)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--clips", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--units", default="fused,cudnn", help="comma list of fused, cudnn")
    args = ap.parse_args(argv)
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    enc = BatchEncoder("s2-pro" if cuda else "tiny", 24000, device, 240.0,
                       precision="bf16" if cuda else "float32", layout="channels-last")
    g = torch.Generator().manual_seed(0)
    samples = int(args.seconds * enc.codec.sample_rate) // enc.codec.frame_length * enc.codec.frame_length
    x = (0.1 * torch.randn(args.clips, 1, samples, generator=g)).to(enc.device)
    ceil = ceilings(enc.device)
    runs = []
    with torch.inference_mode():
        for units in args.units.split(","):
            enc.configure("channels-last", units=units)
            runs.append(measure(enc, x, args.reps, ceil))
    report = {"device": torch.cuda.get_device_name() if cuda else "cpu (tiny codec: a harness check)",
              "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"), "clips": args.clips,
              "seconds": round(samples / enc.codec.sample_rate, 3), "precision": enc.precision,
              "ceilings": ceil, "runs": runs}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "encode_stages.json").write_text(json.dumps(report, indent=1))
    print_table(report)


if __name__ == "__main__":
    main()
