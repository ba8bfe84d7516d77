"""The fused codec convs' launch tiles swept per conv shape on the GPU: the table
``kernels/tuned_codec_conv.json`` (:mod:`ttsfleet.kernels.codec_conv_tiles`) comes from here.

Why (issue #25): on an H100 the fused residual-unit convs ran at ~85-225 TFLOP/s (a whole unit's
FLOPs over its time; 2026-12-05b call1), and four tiles tried then beside the heuristic's were up to
1.5x slower, none more than 2 % faster (the space was not searched); the codec push is now mostly
these convs' compute. Each conv shape the serving decoder and the fill job's encoder run fused —
the 7-tap dilated conv with the Snake epilogue and the 1x1 conv with the residual add, at each
narrow width, on the rows of a 64-stream x 4-frame push (decoder) or of 4 x 5 s clips (encoder) —
is timed with:

1. a grid of output tiles ``BT x BN x BK`` (time rows x output channels x input channels a step;
   masked where a block passes the width) at 3 pipeline stages, 8 warps for the large ones;
2. the warps and stages around the two fastest of 1.

Every candidate's output is checked against the torch reference (float32 accumulation,
:func:`~ttsfleet.kernels.codec_conv.conv_rows_ref`) before it is timed; a tile that fails to compile
(shared memory) or is off is skipped and recorded so. Times: CUDA events, median of ``--reps``.
The winner replaces the heuristic's tile only if it is at least ``--min-gain`` faster (noise).
``--budget-s`` stops the sweep early (the defaults and what was done are still written).

Output under OUT: ``codec_tiles.json`` (every candidate), ``tuned_codec_conv.json`` (the table, with
the GPU, date and command), ``codec_tiles.png`` and a table on stdout; ``--write-table`` also copies
the table to ``kernels/``.

Usage (device, repo root): ``python3 -m benchmarks.inference_h200.codec_tiles OUT_DIR`` (``speed_run.sh
codectiles``); ``--device cpu`` runs one small shape through Triton's interpreter (a harness check).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from ttsfleet.inference.bench_engine import call_ms
from ttsfleet.kernels import codec_conv_tiles as ct
from ttsfleet.kernels.codec_conv import conv_rows, conv_rows_ref
from ttsfleet.kernels.codec_conv_tiles import ConvTile

#: The S2 encoder's fused widths and their rows per audio sample (44.1 kHz; strides 2, 4 before them).
ENCODER_ROWS_PER_SAMPLE = {64: 1.0, 128: 0.5, 256: 0.125}
SMEM_BYTES = 160 * 1024  # the pipeline's operand buffers must fit (H100/H200: 227 KiB per block)


@dataclass(frozen=True)
class ConvShape:
    """One conv the codec runs fused: ``ksize`` taps at ``dilation``, ``width`` in and out, the
    Snake epilogue (7 taps) or the residual add (1x1), over ``streams`` x ``rows`` time rows."""

    part: str
    width: int
    ksize: int
    streams: int
    rows: int
    dilation: int = 3

    @property
    def key(self) -> str:
        return ct.conv_key(self.ksize, self.width, self.width)

    @property
    def gflop(self) -> float:
        return 2 * self.streams * self.rows * self.width * self.width * self.ksize / 1e9


def shapes(args: argparse.Namespace, cpu: bool) -> list[ConvShape]:
    if cpu:
        return [ConvShape("decoder", 16, k, 2, 40) for k in (7, 1)]
    decoder = [ConvShape("decoder", w, k, args.streams, ct.S2_DECODER_UNIT_ROWS_PER_FRAME[w] * args.frames)
               for w in args.decoder_widths for k in (7, 1)]
    samples = 44100 * args.clip_seconds
    per_clip = {w: int(ENCODER_ROWS_PER_SAMPLE[w] * samples) for w in args.encoder_widths}
    encoder = [ConvShape("encoder", w, k, args.clips, per_clip[w])
               for w in args.encoder_widths for k in (7, 1)]
    # what runs fused today first (a budget cut keeps those): the narrow decoder widths, the encoder,
    # then the wider decoder ones (cuDNN's today: a won tile could move the width limit)
    narrow = [c for c in decoder if c.width <= 256]
    return narrow + encoder + [c for c in decoder if c.width > 256]


def _fits(t: ConvTile) -> bool:
    smem = t.num_stages * (t.block_t * t.block_k + t.block_k * t.block_n) * 2
    return smem <= SMEM_BYTES and t.block_t * t.block_n <= 256 * 128


def grid_tiles(width: int, cpu: bool) -> list[ConvTile]:
    """Stage 1: every output tile up to the width's next power of two, 3 stages."""
    if cpu:
        return [ConvTile(16, 16, 16, 4, 2), ConvTile(32, 16, 16, 4, 2)]
    top = 1 << (width - 1).bit_length()
    tiles = []
    for bt in (64, 128, 256):
        for bn in (32, 64, 128, 256):
            for bk in (32, 64, 128):
                if bn > max(32, top) or bk > max(32, top):
                    continue
                t = ConvTile(bt, bn, bk, 8 if bt * bn >= 128 * 128 else 4, 3)
                if _fits(t):
                    tiles.append(t)
    return tiles


def around(best: list[ConvTile], seen: set[ConvTile], cpu: bool) -> list[ConvTile]:
    """Stage 2: the warps and stages around the fastest tiles of stage 1."""
    out = []
    for t in best:
        for warps in ((4,) if cpu else (4, 8)):
            for stages in ((2, 3) if cpu else (2, 3, 4, 5)):
                c = ConvTile(t.block_t, t.block_n, t.block_k, warps, stages)
                if c not in seen and c not in out and _fits(c):
                    out.append(c)
    return out


class Shape:
    """A shape's tensors, its float32 reference output, and timing of one tile on it."""

    def __init__(self, s: ConvShape, dev: torch.device, dtype: torch.dtype, reps: int) -> None:
        g = torch.Generator().manual_seed(s.width * 10 + s.ksize)
        self.s, self.reps, self.dev = s, reps, dev
        self.dil = s.dilation if s.ksize > 1 else 1
        pad = (s.ksize - 1) * self.dil
        self.x = torch.randn(s.streams, s.rows + pad, s.width, generator=g).to(dev, dtype)
        scale = (s.width * s.ksize) ** -0.5
        self.w = (scale * torch.randn(s.ksize, s.width, s.width, generator=g)).to(dev, dtype)
        self.b = (0.1 * torch.randn(s.width, generator=g)).to(dev, dtype)
        self.alpha = (torch.rand(s.width, generator=g) + 0.5).to(dev, dtype) if s.ksize > 1 else None
        rows = (s.streams, s.rows, s.width)
        self.res = None if s.ksize > 1 else torch.randn(rows, generator=g).to(dev, dtype)
        self.out = torch.empty(rows, device=dev, dtype=dtype)
        ref = torch.empty(self.out.shape, device=dev, dtype=torch.float32)
        f32 = (lambda t: None if t is None else t.float())  # noqa: E731
        self.ref = conv_rows_ref(self.x.float(), self.w.float(), self.b.float(), ref, self.dil,
                                 f32(self.alpha), f32(self.res))

    def run(self, tile: ConvTile) -> torch.Tensor:
        return conv_rows(self.x, self.w, self.b, self.out, self.dil, self.alpha, self.res, tile=tile)

    def measure(self, tile: ConvTile) -> dict[str, Any]:
        try:
            err = float((self.run(tile).float() - self.ref).norm() / self.ref.norm())
        except Exception as e:  # noqa: BLE001 - a tile that does not compile (shared memory, registers)
            return {"tile": tile.label, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"}
        if not err < 2e-2:
            return {"tile": tile.label, "error": f"output off the reference: rel. error {err:.2e}"}
        ms = statistics.median(call_ms(lambda: self.run(tile), self.dev) for _ in range(self.reps))
        return {"tile": tile.label, "ms": round(ms, 4), "rel_err": round(err, 5),
                "tflops": round(self.s.gflop / ms, 1)}


def sweep(s: ConvShape, args: argparse.Namespace, dev: torch.device, deadline: float,
          bar: Any) -> dict[str, Any]:
    cpu = dev.type == "cpu"
    shape = Shape(s, dev, torch.float32 if cpu else torch.bfloat16, args.reps)
    default = ct.default_tile(s.rows, s.width, s.width)
    row: dict[str, Any] = {"part": s.part, "key": s.key, "width": s.width, "ksize": s.ksize,
                           "streams": s.streams, "rows": s.rows, "gflop": round(s.gflop, 2),
                           "default": shape.measure(default), "candidates": []}
    seen = {default}

    def measure_all(tiles: list[ConvTile]) -> bool:
        """Each of ``tiles`` measured in order; False once the budget is spent (the row says so)."""
        for t in tiles:
            if time.monotonic() > deadline:
                row["cut_by_budget"] = True
                return False
            seen.add(t)
            row["candidates"].append(shape.measure(t))
            if bar is not None:
                bar.update(1)
        return True

    if measure_all([t for t in grid_tiles(s.width, cpu) if t not in seen]):
        # stage 2 around stage 1's two fastest (the default counts)
        done = [r for r in [row["default"], *row["candidates"]] if "ms" in r]
        best = [ConvTile.parse(r["tile"]) for r in sorted(done, key=lambda r: r["ms"])[:2]]
        measure_all(around(best, seen, cpu))
    return _pick(row, args.min_gain)


def _pick(row: dict[str, Any], min_gain: float) -> dict[str, Any]:
    """The winner: the fastest candidate if it beats the default by ``min_gain``, else the default."""
    ok = [r for r in row["candidates"] if "ms" in r]
    default = row["default"]
    best = min(ok, key=lambda r: r["ms"], default=None)
    if "ms" not in default or best is not None and best["ms"] < default["ms"] * (1 - min_gain):
        row["winner"] = best
    else:
        row["winner"] = default
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--frames", type=int, default=4)
    ap.add_argument("--clips", type=int, default=4)
    ap.add_argument("--clip-seconds", type=float, default=5.0)
    ap.add_argument("--decoder-widths", default="192,96,384", type=_ints)
    ap.add_argument("--encoder-widths", default="64,128,256", type=_ints)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--min-gain", type=float, default=0.03)
    ap.add_argument("--budget-s", type=float, default=420.0)
    ap.add_argument("--write-table", action="store_true", help="also copy the table to kernels/")
    args = ap.parse_args()
    dev = torch.device(args.device)
    cpu = dev.type == "cpu"
    if cpu:  # the Triton kernels through the interpreter (TRITON_INTERPRET=1 set before triton's import)
        from ttsfleet.kernels import dispatch

        dispatch.configure("interpret")
        if not dispatch.use_triton(torch.empty(1)):
            raise SystemExit("--device cpu needs TRITON_INTERPRET=1 (Triton's interpreter)")
    todo = shapes(args, cpu)
    deadline = time.monotonic() + args.budget_s
    bar = _progress(sum(len(grid_tiles(s.width, cpu)) + (4 if cpu else 18) for s in todo))  # stage 2: ~
    rows = []
    for s in todo:
        rows.append(sweep(s, args, dev, deadline, bar))
        _write(args, rows, dev)  # after every shape: a run cut by its time cap keeps what it has
    if bar is not None:
        bar.close()
    print_table(rows)


def _ints(text: str) -> list[int]:
    return [int(w) for w in text.split(",") if w]


def _progress(total: int) -> Any:
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc="codec conv tiles", unit="tile", file=sys.stderr)


def _write(args: argparse.Namespace, rows: list[dict[str, Any]], dev: torch.device) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    gpu = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    meta = {"gpu": gpu, "torch": torch.__version__, "command": " ".join(sys.argv),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    (out / "codec_tiles.json").write_text(json.dumps({**meta, "rows": rows}, indent=1) + "\n")
    won = {r["key"]: (ConvTile.parse(r["winner"]["tile"]), r["winner"]["ms"])
           for r in rows if r.get("winner")}
    table = out / "tuned_codec_conv.json"
    table.write_text(json.dumps(ct.table_json(won, meta), indent=1) + "\n")
    if args.write_table:
        shutil.copyfile(table, ct.TUNED_FILE)
    plot(rows, out / "codec_tiles.png")


def print_table(rows: list[dict[str, Any]]) -> None:
    print("\n| part | conv | rows | default tile | ms | TFLOP/s | winner | ms | TFLOP/s | speed-up | tried |")
    print("|---|---|---:|---|---:|---:|---|---:|---:|---:|---:|")
    for r in rows:
        d, w = r["default"], r.get("winner") or {}
        gain = f"{d['ms'] / w['ms']:.2f}x" if "ms" in d and "ms" in w else "-"
        conv = f"{'7-tap + Snake' if r['ksize'] > 1 else '1x1 + residual'} C={r['width']}"
        cells = [r["part"], conv, f"{r['streams'] * r['rows']:,}", d["tile"], d.get("ms", "-"),
                 d.get("tflops", "-"), w.get("tile", "-"), w.get("ms", "-"), w.get("tflops", "-"), gain,
                 len(r["candidates"]) + 1]
        print("| " + " | ".join(str(c) for c in cells) + " |")


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['part'][:3]} k{r['ksize']} C{r['width']}" for r in rows]
    default = [r["default"].get("ms", 0) for r in rows]
    winner = [(r.get("winner") or {}).get("ms", 0) for r in rows]
    fig, ax = plt.subplots(figsize=(max(6, len(rows) * 0.9), 4))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], default, 0.4, label="heuristic tile")
    ax.bar([x + 0.2 for x in xs], winner, 0.4, label="swept winner")
    ax.set_xticks(list(xs), labels, rotation=30, ha="right")
    ax.set_ylabel("ms per conv")
    ax.set_title("fused codec convs: heuristic vs swept tile")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
