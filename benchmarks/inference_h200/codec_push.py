"""Batched streaming codec, S2 size (random weights): ms per push eagerly and replayed from CUDA graphs.

Run on the device from the repo root: ``python3 -m benchmarks.inference_h200.codec_push OUT.json``.
"""

from __future__ import annotations

import json
import sys

import torch
from ttsfleet.inference.bench_engine import codec_push_ms
from ttsfleet.inference.codec import load_codec


def main() -> None:
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    codec = load_codec("s2-pro", device=dev)
    rows = codec_push_ms(codec, batches=(1, 16, 64), frames=(1, 4))
    for r in rows:
        print(f"graphs={r['graphs']!s:5} B={r['streams']:3} T={r['frames']}: {r['ms']:8.2f} ms "
              f"({r['frames_per_s']:.0f} frames/s)")
    report = {"device": torch.cuda.get_device_name() if dev == "cuda" else "cpu", "torch": torch.__version__,
              "dtype": "float32", "rows": rows}
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
