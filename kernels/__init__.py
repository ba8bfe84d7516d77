"""ttsfleet.kernels — every Triton kernel of ttsfleet, each with a torch reference of the same numerics.

FP8 block-scaled GEMMs and the fused SwiGLU MLP (``ops``), the decode step's norm / RoPE / attention /
sampler kernels (``decode``), the DualAR token-window kernel (``window``). Which backend runs on a
device is decided once, from the GPU catalog, in ``dispatch``. May import torch/triton and the
ttsfleet core only (never ``ttsfleet.inference``).

Public API (imported lazily so ``ttsfleet --help`` does not import torch)::

    from ttsfleet.kernels import (QuantizedWeight, quantize_weight, quantize_activation,
                                  linear_fp8, swiglu_mlp_fp8, prev_tokens_shift_)

Layouts: see :mod:`ttsfleet.kernels.layout`. Numerics: see :mod:`ttsfleet.kernels.reference`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .layout import QuantizedWeight as QuantizedWeight
    from .ops import linear_fp8 as linear_fp8
    from .ops import linear_fp8_codes as linear_fp8_codes
    from .ops import quantize_activation as quantize_activation
    from .ops import quantize_weight as quantize_weight
    from .ops import swiglu_mlp_fp8 as swiglu_mlp_fp8
    from .ops import swiglu_mlp_fp8_codes as swiglu_mlp_fp8_codes
    from .window import prev_tokens_shift_ as prev_tokens_shift_

_EXPORTS = {
    "QuantizedWeight": "layout",
    "quantize_weight": "ops",
    "quantize_activation": "ops",
    "linear_fp8": "ops",
    "swiglu_mlp_fp8": "ops",
    "linear_fp8_codes": "ops",
    "swiglu_mlp_fp8_codes": "ops",
    "prev_tokens_shift_": "window",
}
# Issue 7's name for the window kernel; same function.
_ALIASES = {"prev_tokens_shift_inplace": "prev_tokens_shift_"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    import importlib

    target = _ALIASES.get(name, name)
    if target not in _EXPORTS:
        raise AttributeError(f"module 'ttsfleet.kernels' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[target]}", __name__), target)
    globals()[name] = value
    return value
