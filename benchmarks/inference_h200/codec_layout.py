"""The serving codec's batched streaming push, NCL vs channels-last decoder convs, side by side (issue #25).

Why: codec_convs.py measured each convolution alone (0.72x channels-last, layout conversions not
timed); this measures what the server runs: the S2-size decoder (random weights, bf16, fused Snake,
cuDNN autotuner on) as a :class:`~ttsfleet.inference.codec.SlotCodecStream` replayed from CUDA
graphs, once with ``channels_last=False`` and once with ``True``, in one process on one codec.
Per push shape (streams x frames): the CUDA-event median of the graph replays, the wall median of a
whole push (input copies, replay, audio to the host), and how far the channels-last audio is from
the NCL audio (max abs, and max abs over the NCL peak) on the first and second push of fresh
streams (the second one carries stream state). Prints a table; JSON to ``argv[1]``.

    python3 -m benchmarks.inference_h200.codec_layout OUT.json               # device, repo root
    python3 -P -m benchmarks.inference_h200.codec_layout OUT.json --device cpu --tiny --reps 2

``--fuse-bias both``: the whole table twice in one process, the conv bias added by the conv
(``off``) then by the fused Snake that follows (``on``, ``codec_layers.Snake.fuse_bias``); each
row says which (``fuse_bias``). Default ``on`` (what the served codec runs since the 2026-12-04 run).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from typing import Any

import torch

SHAPES = ((1, 1), (16, 4), (64, 4), (128, 4))
#: The shape whose audio is also compared with a float32 decode (:func:`reference_errors`).
REF_SHAPE = (16, 4)


def _parse_shapes(text: str) -> tuple[tuple[int, int], ...]:
    """``"1x1,64x4"`` -> ``((1, 1), (64, 4))`` (streams x frames)."""
    return tuple((int(b), int(t)) for b, t in (s.split("x") for s in text.split(",") if s))


def _fresh(dec: Any, rows: int) -> None:
    """Reset the real slots and the scratch rows a bucket pads with: a push on them starts new streams."""
    for s in range(rows):
        dec.reset(s)
    for s in range(dec.slots, dec.slots + dec.pad):
        dec.reset(s)


def _errors(alt: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
    """Worst sample (absolute, and over the reference's peak) and the SNR of ``alt`` against ``ref``."""
    d = alt.double() - ref.double()
    diff = d.abs().max().item()
    peak = ref.double().abs().max().item()
    snr = 10 * math.log10(max(ref.double().pow(2).sum().item(), 1e-30) / max(d.pow(2).sum().item(), 1e-30))
    return {"max_abs": diff, "rel": diff / max(peak, 1e-12), "peak": peak, "snr_db": round(snr, 2)}


def _replay_ms(graph: Any, reps: int) -> float:
    """CUDA-event median of ``reps`` replays of a captured push (inputs as last copied in)."""
    from ttsfleet.inference.bench_engine import replay_ms

    for _ in range(3):
        graph.graph.replay()
    torch.cuda.synchronize()
    return replay_ms(graph.graph, reps)


def _push_ms(dec: Any, slots: list[int], codes: torch.Tensor, reps: int) -> float:
    """Wall median of whole pushes (what the codec thread pays: copies in, decode, audio out)."""
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        dec.push(slots, codes).float().cpu()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def measure(codec: Any, shapes: tuple[tuple[int, int], ...], reps: int,
            graphs: bool) -> tuple[list[dict], dict]:
    """One row per shape: both layouts' times and the channels-last audio's distance from NCL's; and
    the codes and audio of :data:`REF_SHAPE` (else the first shape) for :func:`reference_errors`."""
    max_b = max(b for b, _ in shapes)
    layouts = (("ncl", False), ("channels_last", True))
    decs = {name: codec.slot_decoder(max_b, max_frames=4096, graphs=graphs, graph_max_batch=max_b,
                                     channels_last=cl) for name, cl in layouts}
    gen = torch.Generator().manual_seed(0)
    rows: list[dict] = []
    kept: dict = {}
    for b, t in shapes:
        slots = list(range(b))
        codes = [torch.randint(0, 1000, (b, codec.num_codebooks, t), generator=gen) for _ in range(2)]
        row: dict[str, Any] = {"streams": b, "frames": t}
        audio: dict[str, list[torch.Tensor]] = {}
        for name, dec in decs.items():
            _fresh(dec, b)
            audio[name] = [dec.push(slots, c).float().cpu() for c in codes]  # captures on first use
            graph = dec.graphs.get((dec.bucket(b), t)) if dec.use_graphs else None
            row[f"{name}_graphed"] = graph is not None
            if graph is not None:
                row[f"{name}_replay_ms"] = round(_replay_ms(graph, reps), 4)
            row[f"{name}_push_ms"] = round(_push_ms(dec, slots, codes[1], max(3, reps // 2)), 4)
        first = _errors(audio["channels_last"][0], audio["ncl"][0])
        second = _errors(audio["channels_last"][1], audio["ncl"][1])
        row.update({"max_abs_err": max(first["max_abs"], second["max_abs"]),
                    "rel_err": max(first["rel"], second["rel"]), "ncl_peak": first["peak"],
                    "snr_db": min(first["snr_db"], second["snr_db"]),
                    "err_first_push": first, "err_second_push": second})
        if (b, t) == REF_SHAPE or len(shapes) == 1 or not rows:
            kept = {"shape": (b, t), "codes": codes[0], "audio": {k: v[0] for k, v in audio.items()}}
        key = "replay_ms" if row.get("ncl_replay_ms") and row.get("channels_last_replay_ms") else "push_ms"
        row["speedup"] = round(row[f"ncl_{key}"] / max(row[f"channels_last_{key}"], 1e-9), 3)
        row["timed"] = key
        rows.append(row)
        print(_line(row), flush=True)
    return rows, kept


def reference_errors(name: str, device: str, kept: dict) -> dict:
    """How far each layout's audio (first push of ``kept``'s shape) is from a float32 NCL decode of
    the same codes and weights (TF32 off): the noise floor the channels-last error compares with.
    Why: bf16 through the random S2-size residual stacks (which grow the signal ~30x) rounds very
    differently per conv algorithm, so "channels-last vs NCL" alone cannot say which is off."""
    from ttsfleet.inference.codec import load_codec

    ref_codec = load_codec(name, device=device, dtype=torch.float32, channels_last=False)
    b, _ = kept["shape"]
    tf32 = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        ref = ref_codec.slot_decoder(b, max_frames=4096).push(list(range(b)), kept["codes"]).float().cpu()
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = tf32
    del ref_codec
    errs = {f"{k}_vs_float32": _errors(v, ref) for k, v in kept["audio"].items()}
    return {"shape": list(kept["shape"]), **errs}


def _line(r: dict) -> str:
    key = r["timed"]
    return (f"{r['streams']:4d} x {r['frames']}: NCL {r[f'ncl_{key}']:9.3f} ms  channels-last "
            f"{r[f'channels_last_{key}']:9.3f} ms  ({r['speedup']:.2f}x, {key})  push wall "
            f"{r['ncl_push_ms']:8.2f} / {r['channels_last_push_ms']:8.2f} ms  max abs err "
            f"{r['max_abs_err']:.3g} (rel {r['rel_err']:.3g}, SNR {r['snr_db']:.1f} dB)")


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out", nargs="?", help="JSON report path")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tiny", action="store_true", help="the tiny codec in float32 (a CPU smoke run)")
    p.add_argument("--reps", type=int, default=30, help="timed replays per shape and layout (>= 20 on a GPU)")
    p.add_argument("--fuse-bias", choices=("on", "off", "both"), default="on",
                   help="conv bias folded into the following fused Snake (both: off, then on)")
    p.add_argument("--shapes", default=",".join(f"{b}x{t}" for b, t in SHAPES), help="streams x frames list")
    args = p.parse_args(argv)
    from ttsfleet.inference.codec import load_codec

    t0 = time.time()
    cuda = torch.device(args.device).type == "cuda"
    if cuda:
        torch.backends.cudnn.benchmark = True  # as the engine and the codec process run the codec
    codec = load_codec("tiny" if args.tiny else "s2-pro", device=args.device, fast=cuda and not args.tiny)
    torch.set_grad_enabled(False)
    name = "tiny" if args.tiny else "s2-pro"
    from ttsfleet.inference.codec_layers import set_fuse_bias

    rows, kept = [], {}
    for fuse in ((False, True) if args.fuse_bias == "both" else (args.fuse_bias == "on",)):
        set_fuse_bias(codec, fuse)  # read when a decoder captures its graphs: new decoders per pass
        print(f"fuse_bias {'on' if fuse else 'off'}:", flush=True)
        part, kept = measure(codec, _parse_shapes(args.shapes), args.reps, graphs=cuda)
        rows += [{"fuse_bias": fuse, **r} for r in part]
    try:
        ref = reference_errors(name, args.device, kept)
        for k in ("ncl", "channels_last"):
            e = ref[f"{k}_vs_float32"]
            print(f"{k} vs float32 at {ref['shape']}: max abs {e['max_abs']:.3g} (rel {e['rel']:.3g}), "
                  f"SNR {e['snr_db']:.1f} dB")
    except Exception as exc:  # an extra: the table above is the result
        ref = {"error": f"{type(exc).__name__}: {exc}"}
        print(f"float32 reference failed: {ref['error']}")
    report = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
              "cudnn": torch.backends.cudnn.version() if cuda else None,
              "codec": name, "dtype": str(codec.dtype).removeprefix("torch."),
              "fused_snake": any(getattr(m, "fused", False) for m in codec.modules()),
              "rows": rows, "float32_reference": ref, "wall_s": round(time.time() - t0, 1)}
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(report, fh, indent=1)
    print(f"wall {report['wall_s']} s")
    return report


if __name__ == "__main__":
    main()
