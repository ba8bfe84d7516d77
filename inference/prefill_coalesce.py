"""Whether the engine holds newly arrived prompts back for one iteration, to prefill them together.

Why: one ``model.prefill_batch`` call costs the host about as much for one prompt as for several
(its ~16 launches per layer are per call, not per prompt). Under closed-loop load requests arrive
one at a time, so without holding every arrival gets its own call: py-spy of the served path at
c=64 on an H200 (2026-12-02, ``benchmarks/inference_h200/2026-12-02-ab/run2-gate-served-pyspy``)
had the engine thread inside ``prefill_batch`` in 82 % of its samples while the GPU was busy 39 %
of the time. Holding a lone arrival for a few milliseconds while a batch is decoding lets the next
arrivals join its call; the GPU keeps decoding meanwhile. A hold is never longer than the window,
never happens when nothing is decoding (the GPU would idle), and ends as soon as enough prompts
wait to make the call worth it.

A pure function of what the engine observes, so the rule is tested without an engine.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CoalesceRule:
    """``window_s``: the longest an arrival is held (0 = never hold); ``enough_prompts``: a call
    with this many waiting prompts runs at once; ``token_budget``: as do waiting prompts that
    already fill one iteration's prefill budget."""

    window_s: float = 0.0
    enough_prompts: int = 4
    token_budget: int = 2048

    def __post_init__(self) -> None:
        if self.window_s < 0 or self.enough_prompts < 1 or self.token_budget < 1:
            raise ValueError("prefill coalescing: window_s >= 0, enough_prompts >= 1, token_budget >= 1")


@dataclass(frozen=True)
class Arrivals:
    """What the engine sees at the start of an iteration, before it plans the prefill."""

    waiting_prompts: int
    waiting_tokens: int
    oldest_wait_s: float  # since the oldest waiting request was submitted
    admissible: int  # prompts this iteration could take (free KV slots, batch room)
    decoding: bool  # a batch is running: the GPU has work while prompts are held
    continuing: bool  # a prompt is mid-prefill: this iteration makes a prefill call anyway


def hold_arrivals(rule: CoalesceRule, seen: Arrivals) -> bool:
    """True: plan no new prompt this iteration (the ones waiting join a later, fuller call)."""
    if rule.window_s <= 0 or seen.waiting_prompts == 0 or not seen.decoding or seen.continuing:
        return False
    if seen.waiting_prompts >= min(rule.enough_prompts, max(seen.admissible, 1)):
        return False
    if seen.waiting_tokens >= rule.token_budget:
        return False
    return seen.oldest_wait_s < rule.window_s
