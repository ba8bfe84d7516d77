"""The quantization vocabulary: every component spells a weight scheme with these names.

``bsgemm_fp8`` (128x128 weight blocks, 1x128 activation groups, fp32 scales: Hopper),
``mxfp8`` (1x32 blocks with ue8m0 scales: Blackwell) and ``bf16`` (no FP8). A request may also say
``auto`` (the GPU class's scheme, from :mod:`ttsfleet.catalog`). ``none`` is read as ``bf16`` for
old manifests and flags, but never written: :func:`parse_quantization` turns it into ``bf16``, so
two spellings of "no FP8" never meet in a comparison.

The scheme's block layout (what the catalog would otherwise repeat for every class) is
:data:`SCHEME_LAYOUTS`. Core module: imports nothing but pydantic and :mod:`ttsfleet.errors`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal, get_args

from pydantic import BeforeValidator

from ttsfleet.errors import UserError

#: A weight scheme a replica runs.
QuantScheme = Literal["bsgemm_fp8", "mxfp8", "bf16"]
#: What a user may ask for: a scheme, or ``auto`` (the GPU class's scheme).
QuantRequest = Literal["auto", "bsgemm_fp8", "mxfp8", "bf16"]

AUTO = "auto"
BF16: QuantScheme = "bf16"
SCHEMES: tuple[QuantScheme, ...] = get_args(QuantScheme)
FP8_SCHEMES: tuple[QuantScheme, ...] = ("bsgemm_fp8", "mxfp8")
CHOICES: tuple[str, ...] = get_args(QuantRequest)
#: Accepted on input only, rewritten to the canonical name.
ALIASES: dict[str, str] = {"none": "bf16"}


@dataclass(frozen=True)
class SchemeLayout:
    """How one FP8 scheme blocks its scales: activation group, weight block, scale format."""

    activation_block: tuple[int, int]
    weight_block: tuple[int, int]
    scale_format: Literal["fp32", "ue8m0"]


SCHEME_LAYOUTS: dict[str, SchemeLayout] = {
    "bsgemm_fp8": SchemeLayout((1, 128), (128, 128), "fp32"),
    "mxfp8": SchemeLayout((1, 32), (1, 32), "ue8m0"),
}


def choices_text() -> str:
    """``auto | bsgemm_fp8 | mxfp8 | bf16`` for help texts and schema descriptions."""
    return " | ".join(CHOICES)


def canonical(value: object) -> object:
    """Strip, lower-case and resolve aliases; anything else is passed through for validation."""
    if isinstance(value, str):
        value = value.strip().lower()
        return ALIASES.get(value, value)
    return value


def parse_quantization(value: str, *, what: str = "quantization") -> QuantRequest:
    """A requested scheme or ``auto``; raises :class:`UserError` (one line) for anything else."""
    name = canonical(value)
    if name not in CHOICES:
        raise UserError(f"unknown {what} {value!r} (choose from {', '.join(CHOICES)}; none = bf16)")
    return name  # type: ignore[return-value]


def parse_scheme(value: str, *, what: str = "quantization") -> QuantScheme:
    """A concrete scheme (``auto`` is not one); raises :class:`UserError` otherwise."""
    name = parse_quantization(value, what=what)
    if name == AUTO:
        raise UserError(f"{what} must be a concrete scheme here ({', '.join(SCHEMES)}), not auto")
    return name  # type: ignore[return-value]


def is_fp8(scheme: str) -> bool:
    """True for the FP8 schemes (the ones that quantize weights)."""
    return canonical(scheme) in FP8_SCHEMES


#: Pydantic field types that accept the ``none`` alias and store the canonical name.
QuantSchemeField = Annotated[QuantScheme, BeforeValidator(canonical)]
QuantRequestField = Annotated[QuantRequest, BeforeValidator(canonical)]
