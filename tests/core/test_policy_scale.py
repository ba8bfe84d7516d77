"""The scale subresource's total split across pools (ttsfleet.policy.scale): weights, bounds,
house-monotone rounding, clamping, determinism."""

from __future__ import annotations

import itertools

import pytest

from ttsfleet.config import PoolSpec
from ttsfleet.policy import split_replicas, total_bounds


def pool(cls: str, lo: int = 0, hi: int = 16, w: float = 1.0, name: str = "") -> PoolSpec:
    return PoolSpec(gpu_class=cls, min_replicas=lo, max_replicas=hi, weight=w, name=name)


def test_split_by_weight() -> None:
    pools = [pool("h200", w=3), pool("rtx5090", w=1)]
    assert split_replicas(8, pools).pools == {"h200": 6, "rtx5090": 2}
    assert split_replicas(4, pools).pools == {"h200": 3, "rtx5090": 1}


def test_parts_add_up_and_ties_go_by_key() -> None:
    pools = [pool("h200", w=1), pool("rtx5090", w=1), pool("b200", w=1)]
    got = split_replicas(7, pools)
    assert sum(got.pools.values()) == 7 and sorted(got.pools.values()) == [2, 2, 3]
    # the tie (three equal remainders) goes to the first key in sorted order
    assert got.pools["b200"] == 3


def test_heavier_pool_wins_a_remainder_tie() -> None:
    pools = [pool("h200", w=1.5), pool("rtx5090", w=0.5), pool("b200", w=1)]
    # priorities after h200 1, b200 1: h200 1.5/1.5 == rtx5090 0.5/0.5: the heavier h200 wins
    assert split_replicas(3, pools).pools == {"h200": 2, "rtx5090": 0, "b200": 1}


def test_pool_at_its_max_hands_the_rest_to_the_others() -> None:
    pools = [pool("h200", hi=2, w=3), pool("rtx5090", hi=24, w=1)]
    assert split_replicas(10, pools).pools == {"h200": 2, "rtx5090": 8}


def test_pool_at_its_min_keeps_it_and_the_others_share_what_is_left() -> None:
    pools = [pool("h200", lo=0, w=3), pool("rtx5090", lo=3, w=1)]
    assert split_replicas(4, pools).pools == {"h200": 1, "rtx5090": 3}


def test_total_outside_the_bounds_is_clamped_and_reported() -> None:
    pools = [pool("h200", lo=2, hi=4, w=3), pool("rtx5090", lo=1, hi=3, w=1)]
    assert total_bounds(pools) == (3, 7)
    low = split_replicas(0, pools)
    assert low.pools == {"h200": 2, "rtx5090": 1} and low.total == 3 and low.clamped
    high = split_replicas(100, pools)
    assert high.pools == {"h200": 4, "rtx5090": 3} and high.total == 7 and high.clamped
    assert not split_replicas(5, pools).clamped


def test_named_pools_of_one_class_are_keyed_by_name() -> None:
    pools = [pool("h200", name="a", w=1), pool("h200", name="b", w=1)]
    assert split_replicas(3, pools).pools == {"a": 2, "b": 1}


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError):
        split_replicas(-1, [pool("h200")])
    with pytest.raises(ValueError):
        split_replicas(1, [])


@pytest.mark.parametrize("weights", [(1, 1), (3, 1), (0.3, 0.7, 2), (1, 2, 3, 5)])
def test_every_total_is_placed_exactly_within_bounds_and_monotone(weights: tuple[float, ...]) -> None:
    classes = ["h200", "rtx5090", "rtx6000pro", "b200"]
    pools = [pool(c, lo=i % 2, hi=3 + 2 * i, w=w)
             for i, (c, w) in enumerate(zip(classes, weights, strict=False))]
    lo, hi = total_bounds(pools)
    prev = None
    for total in range(lo, hi + 1):
        got = split_replicas(total, pools)
        assert sum(got.pools.values()) == total
        assert all(p.min_replicas <= got.pools[p.key] <= p.max_replicas for p in pools)
        if prev is not None:  # one more replica never takes one away from a pool
            assert all(got.pools[k] >= prev[k] for k in prev), (total, prev, got.pools)
        prev = got.pools
    assert split_replicas(hi, pools).pools == split_replicas(hi, list(reversed(pools))).pools


def test_deterministic_under_pool_order() -> None:
    pools = [pool("h200", w=2), pool("rtx5090", w=1), pool("b200", w=1)]
    results = {tuple(sorted(split_replicas(5, list(order)).pools.items()))
               for order in itertools.permutations(pools)}
    assert len(results) == 1
