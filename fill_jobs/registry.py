"""The cleaning stages a fill job knows: the one place where a stage is registered.

A stage is a name, a one-line help, its place in the run order, and where its implementation
lives (``"module:attribute"``, imported only when a job builds the stage, so this module stays
light: no torch, numpy or pydantic; the operator imports it to validate a FillJob's stage list).

Two kinds of stage:

* ``item`` — runs on one item at a time, in a CPU worker process
  (:mod:`ttsfleet.fill_jobs.prefetch`). The implementation is built as ``impl(config)`` and has
  ``run(work)`` (pure: may only read and set the item's fields and ``work.metrics``; raises
  :class:`~ttsfleet.fill_jobs.audio_io.AudioRejected` to reject). An optional
  ``admit(work, index)`` makes the decisions that depend on earlier items (the duplicate index);
  it runs in the job's main process, in shard order.
* ``batch`` — runs on the accepted clips of a group of items at once (GPU when present,
  :mod:`ttsfleet.fill_jobs.batching`). Built as ``impl(config, device)``; ``process(results)``
  returns the files to add to the output and records what it made in each result's row.

Adding a stage = one :func:`register` call here (or in a plugin module) plus its implementation.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

from ttsfleet.errors import UserError

StageKind = Literal["item", "batch"]


class UnknownStage(UserError, ValueError):
    """A stage name nobody registered (a ``ValueError`` too, so pydantic validators can raise it)."""


@dataclass(frozen=True)
class Stage:
    """One registered cleaning stage."""

    name: str
    help: str
    order: int  # run order: lower first; every item stage runs before every batch stage
    impl: str | Callable[..., Any]  # "package.module:Class" or the class itself
    kind: StageKind = "item"
    default: bool = False  # part of ``--stages default``

    def build(self) -> Callable[..., Any]:
        """The implementation (imported on first use)."""
        if not isinstance(self.impl, str):
            return self.impl
        module, _, attr = self.impl.partition(":")
        return getattr(importlib.import_module(module), attr)


_STAGES: dict[str, Stage] = {}


def register(stage: Stage, *, replace: bool = False) -> Stage:
    """Add a stage; a second stage of the same name is refused unless ``replace``."""
    if not stage.name.isidentifier():
        raise ValueError(f"stage name {stage.name!r} must be an identifier")
    if stage.name in _STAGES and not replace:
        raise ValueError(f"stage {stage.name!r} is already registered")
    if stage.kind not in ("item", "batch"):
        raise ValueError(f"stage {stage.name!r}: kind must be 'item' or 'batch'")
    _STAGES[stage.name] = stage
    return stage


def unregister(name: str) -> None:
    """Remove a stage (tests that register toy stages clean up with this)."""
    _STAGES.pop(name, None)


def get(name: str) -> Stage:
    try:
        return _STAGES[name]
    except KeyError:
        raise UnknownStage(f"unknown stage {name!r}; known: {', '.join(names())}") from None


def names() -> tuple[str, ...]:
    """Every registered stage, in run order."""
    return tuple(s.name for s in sorted(_STAGES.values(), key=_run_key))


def default_stages() -> tuple[str, ...]:
    return tuple(n for n in names() if _STAGES[n].default)


def _run_key(s: Stage) -> tuple[int, int, str]:
    return (0 if s.kind == "item" else 1, s.order, s.name)


def unknown(candidates: Iterable[str]) -> list[str]:
    """The names in ``candidates`` that are not registered (in their given order)."""
    return [n for n in candidates if n not in _STAGES]


def validate(candidates: Iterable[str]) -> tuple[str, ...]:
    """The chosen stages plus ``decode``, in run order; :class:`UnknownStage` (one line) for an
    unknown name. What ``--stages`` and the operator's FillJob validation both call."""
    chosen = list(candidates)
    bad = unknown(chosen)
    if bad:
        raise UnknownStage(f"unknown stage(s) {', '.join(bad)}; known: {', '.join(names())}")
    wanted = set(chosen) | {"decode"}
    return tuple(n for n in names() if n in wanted)


def check(candidates: list[str]) -> list[str]:
    """``candidates`` unchanged if every name is registered, else :class:`UnknownStage` (one line).
    For a pydantic ``field_validator`` on a stage list (the FillJob's ``stages``)."""
    validate(candidates)
    return candidates


# --- the built-in stages ----------------------------------------------------------------------
_S = "ttsfleet.fill_jobs.stages"
for _stage in (
    Stage("decode", "read wav/flac/mp3/ogg/opus (ffmpeg fallback), mono, resample to targetRate",
          0, f"{_S}:Decode", default=True),
    Stage("hash", "exact duplicates: content hash of the decoded audio", 10, f"{_S}:Hash",
          default=True),
    Stage("vad", "silero-vad: trim leading/trailing silence, split long recordings at pauses", 20,
          f"{_S}:Vad", default=True),
    Stage("quality", "reject clipping, too short/long, silence-only, low SNR, implausible speech "
                     "rate", 30, f"{_S}:Quality", default=True),
    Stage("dedup", "near duplicates: compact spectral fingerprint", 40, f"{_S}:Dedup", default=True),
    Stage("loudness", "normalize to targetLufs (pyloudnorm), limit peaks to peakDbfs", 50,
          f"{_S}:Loudness", default=True),
    Stage("features", "batched log-mel features (torch; CUDA when present), saved as .npy", 100,
          "ttsfleet.fill_jobs.features:LogMelStage", kind="batch"),
    Stage("codec", "batched codec tokenization (the site's codec.pth; CUDA when present): "
                   "num_codebooks x frames int16 codes per output, saved as .npy", 110,
          "ttsfleet.fill_jobs.tokenize:CodecStage", kind="batch"),
):
    register(_stage)
