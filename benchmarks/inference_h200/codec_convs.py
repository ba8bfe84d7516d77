"""The serving codec's convolutions one by one, in today's layout and channels-last (issue #25).

Why: the 64 x 4 push spends ~6.8 ms in cuDNN convolutions (2026-12-03, codec_compile.py's profile),
the largest category, and Inductor's relayout made them slower (10.4 ms). Before rewriting the
decoder around another layout, this measures what each convolution of one push costs as the
decoder calls it (``[N, C, L]``, bf16) and as a 2-D channels-last convolution of the same numbers
(``[N, C, 1, L]`` in NHWC memory, the layout cuDNN's tensor-core kernels prefer), cuDNN's
autotuner on in both (as the engine sets it). Layout conversions are not timed: this is the
ceiling of a decoder kept in channels-last end to end.

Prints each distinct convolution (shape, calls per push, us per call in both layouts) and the
per-push totals; JSON to ``$OUT/codec_convs.json``.

    python3 -m benchmarks.inference_h200.codec_convs        # device, from the repo root
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections import Counter
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

STREAMS, FRAMES = 64, 4


def record_convs(codec: Any) -> Counter:
    """(kind, input shape, weight shape, stride, dilation, groups) of every conv in one 64 x 4 push."""
    from ttsfleet.inference.codec_layers import CausalTransConv

    seen: Counter = Counter()

    def hook(mod: nn.Module, inp: tuple, _out: Any) -> None:
        conv = mod.conv if isinstance(mod, CausalTransConv) else mod  # it calls F.conv_transpose1d itself
        kind = "convT" if isinstance(mod, CausalTransConv) else "conv"
        seen[(kind, tuple(inp[0].shape), tuple(conv.weight.shape), conv.stride[0], conv.dilation[0],
              conv.groups)] += 1

    handles = [m.register_forward_hook(hook) for m in codec.modules()
               if isinstance(m, (nn.Conv1d, CausalTransConv))]
    dec = codec.slot_decoder(STREAMS, max_frames=4096, graphs=False)
    codes = torch.randint(0, 1000, (STREAMS, codec.num_codebooks, FRAMES))
    dec.push(list(range(STREAMS)), codes)
    for h in handles:
        h.remove()
    return seen


def _bench(fn: Any, reps: int = 50) -> float:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000)
    return statistics.median(times)


def time_conv(kind: str, x_shape: tuple, w_shape: tuple, stride: int, dilation: int, groups: int) -> dict:
    dev = torch.device("cuda")
    x = torch.randn(x_shape, device=dev, dtype=torch.bfloat16)
    w = torch.randn(w_shape, device=dev, dtype=torch.bfloat16) * 0.05
    x2 = x.unsqueeze(2).contiguous(memory_format=torch.channels_last)
    w2 = w.unsqueeze(2).contiguous(memory_format=torch.channels_last)
    if kind == "convT":
        ncl = _bench(lambda: F.conv_transpose1d(x, w, None, stride=stride))
        nhwc = _bench(lambda: F.conv_transpose2d(x2, w2, None, stride=(1, stride)))
        ref, alt = F.conv_transpose1d(x, w, None, stride=stride), F.conv_transpose2d(x2, w2, None,
                                                                                       stride=(1, stride))
    else:
        ncl = _bench(lambda: F.conv1d(x, w, None, stride=stride, dilation=dilation, groups=groups))
        nhwc = _bench(lambda: F.conv2d(x2, w2, None, stride=(1, stride), dilation=(1, dilation),
                                       groups=groups))
        ref = F.conv1d(x, w, None, stride=stride, dilation=dilation, groups=groups)
        alt = F.conv2d(x2, w2, None, stride=(1, stride), dilation=(1, dilation), groups=groups)
    err = float((alt.squeeze(2).float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-9))
    return {"ncl_us": round(ncl, 2), "channels_last_us": round(nhwc, 2), "rel_err": round(err, 5)}


def main() -> None:
    from ttsfleet.inference.codec import load_codec

    t0 = time.time()
    torch.backends.cudnn.benchmark = True  # as the engine runs the codec
    codec = load_codec("s2-pro", device=torch.device("cuda"), fast=True)
    convs = record_convs(codec)
    rows = []
    for (kind, xs, ws, stride, dil, groups), calls in sorted(convs.items(), key=lambda kv: -kv[1]):
        r = {"kind": kind, "input": xs, "weight": ws, "stride": stride, "dilation": dil, "groups": groups,
             "calls": calls, **time_conv(kind, xs, ws, stride, dil, groups)}
        rows.append(r)
        print(json.dumps(r), flush=True)
    tot = {k: round(sum(r[k] * r["calls"] for r in rows) / 1000, 3) for k in ("ncl_us", "channels_last_us")}
    res = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "device": torch.cuda.get_device_name(0),
           "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(), "push": f"{STREAMS}x{FRAMES}",
           "rows": rows, "total_ms_per_push": tot, "wall_s": round(time.time() - t0, 1)}
    with open(os.path.join(os.environ.get("OUT", "/tmp"), "codec_convs.json"), "w") as fh:
        json.dump(res, fh, indent=1)
    print(f"per {STREAMS}x{FRAMES} push: convolutions {tot['ncl_us']} ms as called (NCL), "
          f"{tot['channels_last_us']} ms channels-last ({len(rows)} distinct, "
          f"{sum(r['calls'] for r in rows)} calls)")


if __name__ == "__main__":
    main()
