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

import triton.language as tl
from triton import jit

from .triton_gemm import SPLIT_CHOICES, _l2_prefetch_rows, finish_tile, gemm_tile

#: Most rows a one-launch kernel takes: one row tile (``triton_gemm.row_tile`` <= 64) holds them.
MAX_ROWS = 64


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
def gemm_item(item, a_ptr, as_ptr, w_ptr, w_desc, ws_ptr, out_ptr, hs_ptr, part, tickets, M, N, K, F,
              s_am, s_ak, s_asm, s_ask, s_wn, s_wk, s_wsn, s_wsk, s_om, s_on, s_hsm, s_hsk,
              BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SPLIT: tl.constexpr, PER: tl.constexpr,
              A_GROUP: tl.constexpr, W_ROW_GROUP: tl.constexpr, W_K_GROUP: tl.constexpr, MX: tl.constexpr,
              A_FP8: tl.constexpr, EPI: tl.constexpr, H_GROUP: tl.constexpr, SWAP: tl.constexpr,
              W_TMA: tl.constexpr, EXACT_CVT: tl.constexpr, A_CG: tl.constexpr):
    """Work item ``item`` of a one-row-tile GEMM: output tile ``item // SPLIT``'s K share ``item %
    SPLIT``, the GEMM kernel's own tile code (``gemm_tile`` then ``finish_tile``; ``EPI`` 1: the
    SwiGLU epilogue into codes ``out_ptr`` + scales ``hs_ptr``). Returns 1 where this item wrote the
    tile (the last of its shares), the moment to count the tile done."""
    pid_n = item // SPLIT
    pid_k = item % SPLIT
    res, res_u = gemm_tile(a_ptr, as_ptr, w_ptr, w_desc, ws_ptr, M, N, K, F, pid_n, 0, pid_k, s_am, s_ak,
                           s_asm, s_ask, s_wn, s_wk, s_wsn, s_wsk, BM, BN, BK, PER, A_GROUP, W_ROW_GROUP,
                           W_K_GROUP, MX, A_FP8, EPI, SWAP, W_TMA, EXACT_CVT, A_CG)
    return finish_tile(res, res_u, pid_n, pid_n, 0, pid_k, part, tickets, out_ptr, out_ptr, hs_ptr, M, N, F,
                       s_om, s_on, s_hsm, s_hsk, BM, BN, SPLIT, EPI, False, MX, H_GROUP, EXACT_CVT)


@jit
def waiting_gemm_item(item, a_ptr, as_ptr, w_ptr, w_desc, ws_ptr, out_ptr, part, tickets, done_ptr, target,
                      M, N, K, s_am, s_ak, s_asm, s_ask, s_wn, s_wk, s_wsn, s_wsk, s_om, s_on,
                      BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SPLIT: tl.constexpr,
                      PER: tl.constexpr, A_GROUP: tl.constexpr, W_ROW_GROUP: tl.constexpr,
                      W_K_GROUP: tl.constexpr, MX: tl.constexpr, A_FP8: tl.constexpr, SWAP: tl.constexpr,
                      W_TMA: tl.constexpr, EXACT_CVT: tl.constexpr, PREFETCH: tl.constexpr):
    """A GEMM item whose activations other items of the launch write: ask L2 for its first PREFETCH
    weight blocks (weights: nobody writes them), wait until ``done_ptr`` counts ``target``, then
    :func:`gemm_item` reading the activations through L2 (``.cg``). ``A_FP8``: FP8 codes + scales,
    else a float tensor quantized in the GEMM's prologue."""
    if PREFETCH > 0:
        k_first = (item % SPLIT) * PER * BK
        _l2_prefetch_rows(w_ptr, (item // SPLIT) * BN, k_first, PREFETCH * BK, N, K, s_wn, BN)
    wait_for(done_ptr, target)
    gemm_item(item, a_ptr, as_ptr, w_ptr, w_desc, ws_ptr, out_ptr, out_ptr, part, tickets, M, N, K, 0, s_am,
              s_ak, s_asm, s_ask, s_wn, s_wk, s_wsn, s_wsk, s_om, s_on, 0, 0, BM, BN, BK, SPLIT, PER, A_GROUP,
              W_ROW_GROUP, W_K_GROUP, MX, A_FP8, 0, 1, SWAP, W_TMA, EXACT_CVT, True)


@jit
def leave(counters, N: tl.constexpr):
    """The program is out of tickets: count it out; the last one out zeroes the ``N`` counters."""
    tl.debug_barrier()
    out = tl.atomic_add(counters + N - 1, 1, sem="acq_rel", scope="gpu")
    if out == tl.num_programs(0) - 1:
        for i in tl.static_range(N):
            tl.store(counters + i, 0)


def most_shares(tiles: int, k_blocks: int, room: int) -> int:
    """The most split-K shares (of :data:`~.triton_gemm.SPLIT_CHOICES`, each at least 2 K blocks) whose
    ``tiles x shares`` items still fit ``room`` programs (1 where none does)."""
    fits = [s for s in SPLIT_CHOICES if (s == 1 or k_blocks >= 2 * s) and tiles * s <= max(room, tiles)]
    return max(fits) if fits else 1
