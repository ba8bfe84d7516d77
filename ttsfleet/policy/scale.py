"""An explicit replica total (the scale subresource: ``kubectl scale``, an HPA) split across pools.

A TTSDeployment has several pools but the scale subresource has one number. When something sets
``spec.replicas``, every pool starts at its ``minReplicas`` and the remaining replicas are handed
out one at a time, each to the pool (below its ``maxReplicas``) with the highest Sainte-Laguë
priority ``weight / (replicas + 0.5)``: the parts follow the weights, always add up to the total,
and stay within the bounds. Handing out one at a time makes the split *house-monotone*: one
replica more never takes a replica away from any pool (largest-remainder rounding can; that
would move pods between GPU classes on every HPA step). A total outside ``[sum of minimums, sum
of maximums]`` is clamped into it. Pure and deterministic: ties go to the heavier pool, then to
the pool key in sorted order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from ttsfleet.config import PoolSpec


@dataclass(frozen=True)
class ReplicaSplit:
    """Replicas per pool for one requested total, and the total actually placed."""

    requested: int
    total: int
    pools: dict[str, int]

    @property
    def clamped(self) -> bool:
        """True when the pools' bounds could not hold the requested total."""
        return self.total != self.requested


def total_bounds(pools: Sequence[PoolSpec]) -> tuple[int, int]:
    """The totals the pools can hold: (sum of minReplicas, sum of maxReplicas)."""
    return sum(p.min_replicas for p in pools), sum(p.max_replicas for p in pools)


def _next_pool(pools: Sequence[PoolSpec], out: dict[str, int]) -> PoolSpec:
    """The pool that gets the next replica: highest weight / (replicas + 1/2), exact arithmetic."""
    open_ = [p for p in pools if out[p.key] < p.max_replicas]
    return min(open_, key=lambda p: (-Fraction(p.weight) / (out[p.key] + Fraction(1, 2)), -p.weight, p.key))


def split_replicas(total: int, pools: Sequence[PoolSpec]) -> ReplicaSplit:
    """``total`` replicas over ``pools`` by weight within each pool's bounds (see module doc)."""
    if not pools:
        raise ValueError("split_replicas needs at least one pool")
    if total < 0:
        raise ValueError(f"replicas must be >= 0, got {total}")
    lo, hi = total_bounds(pools)
    placed = min(max(total, lo), hi)
    out = {p.key: p.min_replicas for p in pools}
    for _ in range(placed - lo):
        out[_next_pool(pools, out).key] += 1
    return ReplicaSplit(requested=total, total=placed, pools=out)
