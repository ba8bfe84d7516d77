"""The engine's state checked after every prefill call and decode step (``TTSFLEET_ENGINE_CHECKS=on``).

Why: a device-side assert is raised by the first op that reads a bad value, often steps after the
op that wrote it, and it kills the CUDA context, so nothing can be read back afterwards (2026-12-06e
call 4: an index out of bounds in five rows of a 104-row decode step at c=128, raised at an unrelated
sync). With the checks on, the engine waits for each call and step and checks what the next one will
read: each slot's pending main-head logits finite, its length inside the cache, the decode rows'
slots where the engine put them (its own rows, then the pad slot) and the sampled frames inside
their vocabularies. The first miss raises :class:`EngineStateError` naming the call or step, the
rows, slots and values, which the engine loop logs as it dies; a step's non-finite logits come with
the step run again (:func:`rerun_report`). It found its first fault on an H100 (2026-12-06f: a whole
batch non-finite in one decode graph's replay, finite when rerun eagerly: the split-K workspaces,
``ttsfleet.kernels.workspaces``). Each check costs a host sync: a diagnostic mode, off by default,
never in a figure of record."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ttsfleet.switches import ProcessSwitch, one_of

ENGINE_CHECKS_ENV = "TTSFLEET_ENGINE_CHECKS"
ENGINE_CHECKS_SWITCH: ProcessSwitch[bool] = ProcessSwitch(
    ENGINE_CHECKS_ENV, "off", lambda raw: one_of(ENGINE_CHECKS_ENV, ("off", "on"), "off")(raw) == "on")

#: rows / slots named in one message at most (a whole batch gone bad needs no 128 numbers)
_SHOWN = 8


class EngineStateError(RuntimeError):
    """A value the next prefill call or decode step would read is out of range."""


@dataclass(frozen=True)
class StepRows:
    """What the engine meant a decode step to run: its request slots, the padded size, the pad slot."""

    slots: Sequence[int]
    padded: int
    pad_slot: int
    step: int


def _first(values: Sequence[int]) -> str:
    shown = ", ".join(str(v) for v in values[:_SHOWN])
    return shown + (f" (+{len(values) - _SHOWN} more)" if len(values) > _SHOWN else "")


def _bad_logit_slots(cache: Any, slots: Sequence[int]) -> list[int]:
    import torch

    if not slots:
        return []
    index = torch.tensor(list(slots), dtype=torch.long, device=cache.pending_logits.device)
    finite = torch.isfinite(cache.pending_logits.index_select(0, index)).all(dim=1).tolist()
    return [s for s, ok in zip(slots, finite, strict=True) if not ok]


def _kv_report(cache: Any, slots: Sequence[int]) -> str:
    """Where a bad slot's non-finite keys / values sit: per slot, the first layer holding any and
    their positions' range (from the K/V written so far), so a message tells a cache filled with
    NaN by some earlier call from logits gone bad in the last one."""
    import torch

    parts = []
    for slot in slots[:_SHOWN]:
        n = int(cache.lengths[slot])
        kv = torch.stack([cache.k[:, slot, :n], cache.v[:, slot, :n]]).float()
        bad = ~torch.isfinite(kv).flatten(3).all(dim=3)  # [2, layer, position]
        if not bool(bad.any()):
            parts.append(f"slot {slot}: K/V finite over {n} positions")
            continue
        layers = bad.any(dim=2).any(dim=0).nonzero().flatten().tolist()
        positions = bad.any(dim=1).any(dim=0).nonzero().flatten().tolist()
        parts.append(f"slot {slot}: non-finite K/V from layer {layers[0]}, positions "
                     f"{positions[0]}..{positions[-1]} ({len(positions)} of {n})")
    return "; ".join(parts)


def check_prefill(cache: Any, landed: Sequence[tuple[int, int]], where: str) -> None:
    """After a prefill call: each ``(slot, expected length)`` in ``landed`` holds that many positions
    and finite pending logits. ``where`` names the call in the error."""
    slots = [s for s, _ in landed]
    lengths = cache.lengths[list(slots)].tolist() if slots else []
    wrong = [f"slot {s}: length {got}, expected {want}"
             for (s, want), got in zip(landed, lengths, strict=True) if got != want]
    if wrong:
        raise EngineStateError(f"{where}: {_first(wrong)}")
    bad = _bad_logit_slots(cache, slots)
    if bad:
        raise EngineStateError(f"{where}: non-finite pending logits in slots {_first(bad)} "
                               f"[{_kv_report(cache, bad)}]")


def check_step(cache: Any, slots_buf: Any, frames: Any, rows: StepRows, vocab: tuple[int, int],
               model: Any = None) -> None:
    """After decode step ``rows.step``: the rows ran the slots meant, the frames are in range and
    every slot the next step reads (the pad slot included) has finite logits and a length inside the
    cache. ``vocab``: (main-token id bound, codebook size). ``model`` (the one that ran the step):
    non-finite logits are explained by :func:`rerun_report` too."""
    where = f"decode step {rows.step} ({len(rows.slots)} rows padded to {rows.padded})"
    ran = slots_buf[:rows.padded].tolist()
    meant = list(rows.slots) + [rows.pad_slot] * (rows.padded - len(rows.slots))
    pairs = enumerate(zip(ran, meant, strict=True))
    moved = [f"row {r}: slot {got}, meant {want}" for r, (got, want) in pairs if got != want]
    if moved:
        raise EngineStateError(f"{where}: {_first(moved)}")
    _check_frames(frames, vocab, len(rows.slots), where)
    read_next = sorted(set(meant))
    bad = _bad_logit_slots(cache, read_next)
    if bad:
        pad = " (the pad slot)" if rows.pad_slot in bad else ""
        rerun = "" if model is None else f" [{rerun_report(model, cache, slots_buf[:rows.padded], frames)}]"
        raise EngineStateError(f"{where}: non-finite pending logits in slots {_first(bad)}{pad} "
                               f"[{_kv_report(cache, bad)}]{rerun}")
    lengths = cache.lengths[read_next].tolist()
    top = cache.max_seq_len
    over = [f"slot {s}: {n}" for s, n in zip(read_next, lengths, strict=True) if not 0 <= n <= top]
    if over:
        raise EngineStateError(f"{where}: lengths outside 0..{top}: {_first(over)}")


def _check_frames(frames: Any, vocab: tuple[int, int], bs: int, where: str) -> None:
    """Each row's main token below ``vocab[0]`` and codes below ``vocab[1]`` (rows past ``bs``: pad)."""
    host = frames.tolist()
    main_bound, codebook = vocab
    bad = [f"row {r}{' (pad)' if r >= bs else ''}: {row}" for r, row in enumerate(host)
           if not 0 <= row[0] < main_bound or not all(0 <= c < codebook for c in row[1:])]
    if bad:
        raise EngineStateError(f"{where}: frames out of range: {_first(bad)}")


def rerun_report(model: Any, cache: Any, slots: Any, frames: Any) -> str:
    """The step's slow half run again on the same rows and frames, the engine's state undone first:
    once through the fused kernels outside any graph, once through the model's plain modules with
    a hook on each, naming the first module whose output is non-finite. A transient fault (a race,
    a graph replay) gives finite logits again; one in the data or the weights repeats and is named.
    The non-finite parameters, if any, are named too (memory written over)."""
    from . import fused

    weights = [name for name, t in [*model.named_parameters(), *model.named_buffers()]
               if t.is_floating_point() and not bool(_all_finite(t))]
    parts = [f"non-finite weights: {_first(weights)}" if weights else "weights finite"]
    uniq = sorted(set(slots.tolist()))
    for label, run in (("fused rerun", lambda: fused.slow_step(model, cache, slots, frames)),
                       ("plain rerun", lambda: model._slow_step(cache, slots, frames))):
        _step_back(cache, uniq)
        first: list[str] = []
        with _first_non_finite_module(model, first):
            run()
        bad = _bad_logit_slots(cache, uniq)
        where = f", first non-finite output: {first[0]}" if first else ""
        parts.append(f"{label}: {len(bad)} of {len(uniq)} slots non-finite{where}")
    return "; ".join(parts)


def _all_finite(t: Any) -> Any:
    """``isfinite(t).all()`` for any float dtype (FP8 codes through float32, a chunk at a time)."""
    import torch

    flat = t.reshape(-1)
    step = 1 << 24
    return all(bool(torch.isfinite(flat[i:i + step].float()).all()) for i in range(0, flat.numel(), step))


def _step_back(cache: Any, slots: Sequence[int]) -> None:
    """Each slot one position back (where the step wrote), a slot already at 0 left there."""
    index = list(slots)
    cache.lengths[index] = (cache.lengths[index] - 1).clamp(min=0)


class _first_non_finite_module:
    """Forward hooks on every submodule of ``model``, appending to ``out`` the name of the first
    whose (first tensor) output holds a non-finite value, in call order."""

    def __init__(self, model: Any, out: list[str]) -> None:
        self.model, self.out, self.handles = model, out, []

    def __enter__(self) -> None:
        import torch

        def hook(name: str) -> Any:
            def check(_module: Any, _inputs: Any, output: Any) -> None:
                t = output[0] if isinstance(output, tuple) else output
                if not self.out and isinstance(t, torch.Tensor) and t.is_floating_point() \
                        and not bool(torch.isfinite(t).all()):
                    self.out.append(name)
            return check

        self.handles = [m.register_forward_hook(hook(n)) for n, m in self.model.named_modules() if n]

    def __exit__(self, *exc: object) -> None:
        for h in self.handles:
            h.remove()
