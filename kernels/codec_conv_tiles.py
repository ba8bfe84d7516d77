"""Which launch tile each fused codec conv runs with: a table measured on a GPU, else a heuristic.

Why a table (issue #25): the fused residual-unit convs (:mod:`.triton_codec_conv`) ran at ~85-225
TFLOP/s on an H100 (a whole unit's FLOPs over its time; 2026-12-05b call1: a width-192 unit of a
64 x 4 push 0.75 ms for 154 GFLOP), a fraction of the tensor cores' peak; four tiles tried then
beside the heuristic's (one for both convs of a unit) were up to 1.5x slower and never more than 2 %
faster: the space was not searched. The sweep ``benchmarks/inference_h200/codec_tiles.py`` times a
grid of tiles per conv shape on the GPU and writes :data:`TUNED_FILE`; this module reads it.
A tile changes speed, never numbers beyond the float32 accumulation order, so a table measured on
one GPU is safe on another (only perhaps slower).

Lookup order for a conv (``ksize``, ``c_in``, ``c_out``): a pinned tile (:func:`set_tile`,
:func:`pin_tiles`: benchmarks' side by side), the shipped table, :func:`default_tile`. A tuned tile
taller than a stream's time rows is not used (it would compute mostly masked rows; the heuristic
sizes the tile to the push).

Pure Python (no Triton import): the compile checks and the benchmarks read it on any machine.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import cache
from typing import Any

#: The table the sweep writes: ``{"gpu": ..., "date": ..., "tiles": {key: {"tile": "BTxBNxBKxWxS",
#: "ms": ...}}}``, keys from :func:`conv_key`. Absent until a GPU run made one.
TUNED_FILE = os.path.join(os.path.dirname(__file__), "tuned_codec_conv.json")


#: The S2 codec decoder's residual-unit widths (one per upsampling block, rates 8, 8, 4, 2) and the
#: time rows each has per codec frame (2,048 samples): the shapes the fused convs are checked
#: (``compile_check``), timed (``codec_units.py``) and tuned (``codec_tiles.py``) at.
S2_DECODER_UNIT_ROWS_PER_FRAME = {768: 32, 384: 256, 192: 1024, 96: 2048}


@dataclass(frozen=True)
class ConvTile:
    """One launch config: a ``block_t x block_n`` output tile, ``block_k`` input channels a step."""

    block_t: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3

    @property
    def label(self) -> str:
        """``BTxBNxBKxWARPSxSTAGES``, the form the table and the benchmarks' ``--tiles`` use."""
        return f"{self.block_t}x{self.block_n}x{self.block_k}x{self.num_warps}x{self.num_stages}"

    @classmethod
    def parse(cls, text: str) -> ConvTile:
        """The tile of a ``BTxBNxBKxWARPSxSTAGES`` label; a ``ValueError`` naming the form otherwise."""
        parts = text.strip().split("x")
        if len(parts) != 5 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise ValueError(f"conv tile {text!r}: expected BTxBNxBKxWARPSxSTAGES, e.g. 128x64x64x8x3")
        bt, bn, bk, warps, stages = (int(p) for p in parts)
        for name, v in (("BT", bt), ("BN", bn), ("BK", bk)):
            if v < 16 or v & (v - 1):
                raise ValueError(f"conv tile {text!r}: {name} must be a power of two >= 16")
        return cls(bt, bn, bk, warps, stages)


def _pow2_divisor(n: int, cap: int) -> int:
    """The largest power of two up to ``cap`` dividing ``n`` (at least 16: ``tl.dot``'s least size)."""
    d = 16
    while d * 2 <= cap and n % (d * 2) == 0:
        d *= 2
    return d


def _next_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def default_tile(t: int, c_in: int, c_out: int) -> ConvTile:
    """The heuristic: whole channel blocks where the widths allow (96 -> 32, 192 -> 64, 384 / 768 ->
    128), 128 time rows unless a stream's push is shorter."""
    block_t = 128 if t >= 128 else max(16, _next_pow2(t))
    block_n = _pow2_divisor(c_out, 128)
    block_k = _pow2_divisor(c_in, 64)
    warps = 8 if block_t * block_n >= 128 * 128 else 4
    return ConvTile(block_t, block_n, block_k, warps)


def conv_key(ksize: int, c_in: int, c_out: int) -> str:
    """A conv shape's table key (time rows are not part of it: see the module doc)."""
    return f"k{ksize}:{c_in}:{c_out}"


def read_table(path: str) -> dict[str, ConvTile]:
    """A table file's tiles by key; a ``ValueError`` naming the file for a malformed one."""
    with open(path) as fh:
        raw = json.load(fh)
    try:
        return {key: ConvTile.parse(entry["tile"]) for key, entry in raw["tiles"].items()}
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        raise ValueError(f"{path}: not a codec conv tile table ({e})") from None


@cache
def _tuned() -> dict[str, ConvTile]:
    """The shipped table (:data:`TUNED_FILE`), empty where there is none."""
    if not os.path.exists(TUNED_FILE):
        return {}
    return read_table(TUNED_FILE)


_PINS: dict[str, ConvTile] = {}


def set_tile(ksize: int, c_in: int, c_out: int, tile: ConvTile | None) -> None:
    """Pin ``tile`` for one conv shape (None removes the pin)."""
    key = conv_key(ksize, c_in, c_out)
    if tile is None:
        _PINS.pop(key, None)
    else:
        _PINS[key] = tile


def pin_tiles(table: dict[str, ConvTile] | None) -> None:
    """Pin every tile of ``table`` (e.g. a fresh sweep's :func:`read_table`) over the shipped one,
    after dropping every pin; None only drops them."""
    _PINS.clear()
    _PINS.update(table or {})


def tile_for(t: int, ksize: int, c_in: int, c_out: int) -> ConvTile:
    """The tile a conv of ``t`` time rows per stream runs with (the lookup order in the module doc)."""
    key = conv_key(ksize, c_in, c_out)
    tile = _PINS.get(key) or _tuned().get(key)
    if tile is None or t < tile.block_t:
        return default_tile(t, c_in, c_out)
    return tile


def table_json(tiles: dict[str, tuple[ConvTile, float]], meta: dict[str, Any]) -> dict[str, Any]:
    """The file form of measured winners (tile and its milliseconds per key) with ``meta`` (gpu,
    date, command) beside them."""
    return {**meta, "tiles": {key: {"tile": tile.label, "ms": round(ms, 4)}
                              for key, (tile, ms) in sorted(tiles.items())}}
