"""In which order an engine iteration plans its prefill: "clocked first".

Why: the live route prefills each session's voice head (a prefix-only job,
:meth:`~ttsfleet.inference.engine.Engine.prefill_prefix`) when the session opens, before any text
exists, so nobody waits for that job yet. With one FIFO and one token budget per iteration for
everything, a text segment whose listener already waits queued behind other sessions' head jobs,
and a head job whose session's text had arrived waited behind jobs nobody waited for. On the H200
(``benchmarks/inference_h200/README.md``, 2026-12-03c and 2026-12-04 run15, 64 live sessions) the
live route's first audio was p50 169 / p99 830 ms in the steady window against 89 / 186 ms over
HTTP, with 50-99 ms of "arrival" (the segment waiting for its head job) and 95-219 ms of "queue"
(waiting for admission with slots free) where HTTP spends 0 and 0-2 ms.

The rule: an entry is *clocked* when someone's time to first audio is running on it — every
normal request (HTTP or a live segment) and a prefix-only job that a waiting text now needs (its
handle marked urgent). Other prefix-only jobs are *background*. An iteration plans clocked entries
before background ones, and within each class prompts already mid-prefill (they hold a slot)
before new arrivals; FIFO within each group. So a background job's next chunk never takes budget a
clocked arrival could use, while clocked continuations keep going first as before. A background
entry that has waited ``max_wait_s`` since it was submitted counts as clocked: it cannot starve.
``max_wait_s = 0`` makes every entry clocked: plain FIFO with continuations first, the old order.

A pure function of what the engine observes, so the rule is tested without an engine (as
:mod:`ttsfleet.inference.prefill_coalesce`).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

#: Longest a background prefix-only job is passed over (seconds since it was submitted) before it
#: counts as clocked. A session's first text comes a few hundred ms after it opens (a voice agent's
#: LLM producing its first sentence) and then marks its head job urgent anyway; the bound is only
#: there so that a job nobody marks is never left behind for good.
BACKGROUND_MAX_WAIT_S = 1.0


@dataclass(frozen=True)
class Entry:
    """One request an iteration may plan, as the rule sees it."""

    clocked: bool  # a first-audio clock runs on it: a request, or a prefix job a waiting text needs
    waited_s: float  # since it was submitted
    continuing: bool = False  # mid-prefill: it holds a slot and continues with its next chunk


def counts_as_clocked(entry: Entry, max_wait_s: float) -> bool:
    """Clocked, or a background entry that has waited long enough to be treated as one."""
    return entry.clocked or entry.waited_s >= max_wait_s


def admission_order(entries: Sequence[Entry], max_wait_s: float = BACKGROUND_MAX_WAIT_S) -> list[int]:
    """Indices of ``entries`` (given in FIFO order: continuations, then arrivals) in the order an
    iteration plans them: clocked continuations, clocked arrivals, background continuations,
    background arrivals; the given order within each group."""
    if max_wait_s < 0:
        raise ValueError("admission order: max_wait_s must be >= 0")

    def group(i: int) -> int:
        entry = entries[i]
        background = not counts_as_clocked(entry, max_wait_s)
        return 2 * background + (not entry.continuing)

    return sorted(range(len(entries)), key=group)  # sorted() is stable: FIFO within a group


def passed_over(entries: Sequence[Entry], planned: Collection[int],
                max_wait_s: float = BACKGROUND_MAX_WAIT_S) -> bool:
    """Whether the arrivals left waiting after an iteration are all background and one of them came
    before (FIFO) a clocked arrival that was planned: what held it back was the order, not a slot or
    the budget alone (the admission wait's reason ``deferred``)."""
    left = [i for i, e in enumerate(entries) if not e.continuing and i not in planned]
    if not left or any(counts_as_clocked(entries[i], max_wait_s) for i in left):
        return False
    jumped = [i for i in planned if not entries[i].continuing and counts_as_clocked(entries[i], max_wait_s)]
    return bool(jumped) and min(left) < max(jumped)
