"""Quantized-weight layouts: the one place that says where every byte and scale lives.

Why a module of its own: a scale tensor read with the wrong strides gives wrong logits at full
speed and no error (the source write-up's mxfp8 bug: scales stored row-major, read K-major). So the
layout is a checked contract, and every kernel receives explicit scale strides instead of assuming.

Contract (``LAYOUT_VERSION`` 1)
-------------------------------
``qweight``: float8_e4m3fn ``[N, K]``, row-major with ``stride(1) == 1`` (K contiguous), never padded.

``bsgemm_fp8`` (H200): ``scale`` float32 ``[ceil(N/128), ceil(K/128)]``; ``scale[i, j]`` is the
dequantization multiplier of the 128x128 block ``qweight[128i:128i+128, 128j:128j+128]`` (edge blocks
are partial). ``w ~= qweight.float() * scale[n // 128, k // 128]``.

``mxfp8`` (OCP MX, RTX 5090 / 6000 PRO): ``scale`` uint8 UE8M0 ``[N, ceil(K/32)]``; ``scale[n, j]``
holds a biased exponent ``e`` (0..254; 255 = NaN is never written) and the multiplier is ``2**(e-127)``
for ``qweight[n, 32j:32j+32]``.

Strides: a scale tensor is *logically* ``[rows, k_blocks]``; element ``(i, j)`` is read at
``i * scale.stride(0) + j * scale.stride(1)``. Kernels always receive both strides, so any strided
view (row-major or K-major storage) is read correctly. What is rejected is a tensor whose *shape*
is not the one above (e.g. a transposed ``[k_blocks, rows]`` tensor). ``to_state_dict`` always
writes the row-major contiguous form, which is what a safetensors file holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ttsfleet.quantization import FP8_SCHEMES, SCHEME_LAYOUTS

if TYPE_CHECKING:
    from torch import Tensor

LAYOUT_VERSION = 1
#: Each FP8 scheme of :mod:`ttsfleet.quantization` and its id in a saved weight's ``meta`` (a file
#: format: the ids follow ``FP8_SCHEMES``' order and are never renumbered).
SCHEMES: dict[str, int] = dict(zip(FP8_SCHEMES, (1, 2), strict=True))
BS_BLOCK = SCHEME_LAYOUTS["bsgemm_fp8"].weight_block[1]  # 128: weight block 128x128, activation group 1x128
MX_BLOCK = SCHEME_LAYOUTS["mxfp8"].weight_block[1]  # 32: group along K (1x32), weights and activations alike
FP8_MAX = 448.0  # largest finite float8_e4m3fn


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def scale_shape(scheme: str, n: int, k: int) -> tuple[int, int]:
    """Logical shape of the weight scale tensor for ``scheme`` and an ``[n, k]`` weight."""
    if scheme == "bsgemm_fp8":
        return (cdiv(n, BS_BLOCK), cdiv(k, BS_BLOCK))
    if scheme == "mxfp8":
        return (n, cdiv(k, MX_BLOCK))
    raise ValueError(f"unknown quantization scheme {scheme!r}; expected one of {sorted(SCHEMES)}")


@dataclass
class QuantizedWeight:
    """An FP8 weight and its scales, laid out as the module docstring says (checked on creation)."""

    qweight: Tensor
    scale: Tensor
    scheme: str
    shape: tuple[int, int]

    def __post_init__(self) -> None:
        import torch

        self.shape = (int(self.shape[0]), int(self.shape[1]))
        n, k = self.shape
        want = scale_shape(self.scheme, n, k)
        if self.qweight.dtype != torch.float8_e4m3fn:
            raise ValueError(f"qweight must be float8_e4m3fn, got {self.qweight.dtype}")
        if tuple(self.qweight.shape) != (n, k):
            raise ValueError(f"qweight shape {tuple(self.qweight.shape)} != declared shape {(n, k)}")
        if k > 1 and self.qweight.stride(1) != 1:
            raise ValueError("qweight must have K contiguous (stride(1) == 1)")
        if tuple(self.scale.shape) != want:
            raise ValueError(
                f"{self.scheme} scale must be logically {list(want)} for weight {[n, k]}, got "
                f"{list(self.scale.shape)} (a transposed scale tensor is a layout bug, not a view)")
        sdt = torch.float32 if self.scheme == "bsgemm_fp8" else torch.uint8
        if self.scale.dtype != sdt:
            raise ValueError(f"{self.scheme} scale must be {sdt}, got {self.scale.dtype}")
        if self.scale.device != self.qweight.device:
            raise ValueError("qweight and scale must be on the same device")

    @property
    def scale_strides(self) -> tuple[int, int]:
        """(row stride, k-block stride) in elements: what the kernels are given."""
        return (self.scale.stride(0), self.scale.stride(1))

    def to(self, device: object) -> QuantizedWeight:
        return QuantizedWeight(self.qweight.to(device), self.scale.to(device), self.scheme, self.shape)

    def to_state_dict(self, prefix: str = "") -> dict[str, Tensor]:
        """Tensors only (safetensors-safe): qweight, row-major contiguous scale, and ``qmeta``.

        ``qmeta`` is int64 ``[LAYOUT_VERSION, scheme_id, N, K]`` so a file needs no side metadata.
        """
        import torch

        meta = torch.tensor([LAYOUT_VERSION, SCHEMES[self.scheme], *self.shape], dtype=torch.int64)
        return {
            prefix + "qweight": self.qweight.contiguous(),
            prefix + "scale": self.scale.contiguous(),
            prefix + "qmeta": meta,
        }

    @classmethod
    def from_state_dict(cls, sd: dict[str, Tensor], prefix: str = "") -> QuantizedWeight:
        """Inverse of :meth:`to_state_dict`; rejects unknown layout versions and schemes."""
        try:
            meta = [int(v) for v in sd[prefix + "qmeta"].tolist()]
            qweight, scale = sd[prefix + "qweight"], sd[prefix + "scale"]
        except KeyError as exc:
            raise ValueError(f"state dict lacks {exc.args[0]!r}") from None
        if len(meta) != 4 or meta[0] != LAYOUT_VERSION:
            raise ValueError(f"unsupported quantized layout {meta[:1]}; this build reads {LAYOUT_VERSION}")
        names = {v: k for k, v in SCHEMES.items()}
        if meta[1] not in names:
            raise ValueError(f"unknown scheme id {meta[1]}")
        return cls(qweight, scale, names[meta[1]], (meta[2], meta[3]))
