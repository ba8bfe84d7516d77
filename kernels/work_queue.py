"""The pieces every persistent one-launch kernel shares: a global ticket of work items, counters of
finished items that later items wait on, and the reset that leaves them zero for the next launch.

Why one module: the one-launch MLP (:mod:`.triton_mlp`) and the fast attention half
(:mod:`.triton_attention_block`) order their work the same way, and the deadlock argument is the same
for both, so it is written (and reviewed) once. A program takes tickets in order until they run out;
an item waits only for items of smaller tickets (``wait_for``), each held by a running program that
never waits while it holds an item of the phase being waited on, so every wait ends whatever the
residency of the grid. Counter layout: ``counters[0]`` the next ticket, ``counters[1 .. N-2]`` the
phases' finished-item counts, ``counters[N-1]`` the programs that left; the last program to leave
zeroes all N (nobody touches them after it), so a CUDA graph replays the launch. The counters are
only touched after the PDL wait: with programmatic dependent launch the previous launch of the same
kernel may still be resetting them until then.
"""

from __future__ import annotations

import torch
import triton.language as tl
from triton import jit

from .triton_gemm import PDL, SPLIT_CHOICES, tma_ok


@jit
def take_ticket(counters):
    """The next work item's number (programs take them in order; no ordering of memory needed)."""
    return tl.atomic_add(counters, 1, sem="relaxed", scope="gpu")


@jit
def count_done(count_ptr):
    """Count one finished item, after the program's stores (the barrier orders every thread's stores
    before the release)."""
    tl.debug_barrier()
    tl.atomic_add(count_ptr, 1, sem="release", scope="gpu")


@jit
def wait_for(count_ptr, target):
    """Spin until ``count_ptr`` reaches ``target`` (acquire: what the counted items wrote is visible;
    read it through L2, ``.cg``: this program's L1 may hold stale lines)."""
    seen = tl.atomic_add(count_ptr, 0, sem="acquire", scope="gpu")
    while seen < target:
        seen = tl.atomic_add(count_ptr, 0, sem="acquire", scope="gpu")


@jit
def leave(counters, N: tl.constexpr):
    """The program is out of tickets: count it out; the last one out zeroes the ``N`` counters."""
    tl.debug_barrier()
    out = tl.atomic_add(counters + N - 1, 1, sem="acq_rel", scope="gpu")
    if out == tl.num_programs(0) - 1:
        for i in tl.static_range(N):
            tl.store(counters + i, 0)


def sm_count(dev: torch.device) -> int:
    """The device's SMs (an H200's in Triton's interpreter): one persistent program per SM."""
    from .decode import NOMINAL_SMS

    return torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else NOMINAL_SMS


def most_shares(tiles: int, k_blocks: int, room: int) -> int:
    """The most split-K shares (of :data:`~.triton_gemm.SPLIT_CHOICES`, each at least 2 K blocks) whose
    ``tiles x shares`` items still fit ``room`` programs (1 where none does)."""
    fits = [s for s in SPLIT_CHOICES if (s == 1 or k_blocks >= 2 * s) and tiles * s <= max(room, tiles)]
    return max(fits) if fits else 1


def waiting_prefetch(dev: torch.device, weight: object, per: int, items: int, block_bytes: int) -> int:
    """Weight blocks each of ``items`` waiting items asks L2 for before its wait: as many as keep them
    all within half of L2 (:func:`.decode.prefetch_blocks` ``auto``); 0 in the interpreter or where
    rows are not 16-byte aligned (the bulk prefetch needs it, as TMA does)."""
    from .decode import l2_bytes, prefetch_blocks

    if not PDL or dev.type != "cuda" or not tma_ok(weight) or weight.shape[1] % 16:
        return 0
    return prefetch_blocks("auto", per, items, block_bytes, l2_bytes(dev.index or 0))
