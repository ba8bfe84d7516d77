"""The autoscaler's state in the TTSDeployment's status: compact, change-only, restored on resume.

:class:`ttsfleet.policy.AutoscaleState` holds every recommendation of the scale-down
stabilization window (one per step), the load samples and the panic deadline, on the policy's
monotonic clock. What a restart must not lose is what can still hold replicas up:

* per pool, the recommendations the window's maximum can still pick: those above every later
  one (a later equal or higher one outlives them). They are frozen once the load falls, so a
  steady state writes nothing; each is stored with its wall time, rounded *up* to a second;
* each pool's newest recommendation, without its time (it moves every step); a restart counts it
  from the restart, which holds it at least as long as the lost time would have;
* the panic deadline (wall time, rounded up);
* the last panic step (wall time, rounded up), which ``burst_hold_s`` holds the scale-down window
  from: without it a restarted operator would drop to the shorter window until the next panic.

The load samples (means over the last seconds) are measured again after a restart. Wall times
are fixed once per monotonic instant (:class:`WallClock`), so clock drift never rewrites them.
Relies on the policy's rule that stabilization keeps the maximum recommendation in the window.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ttsfleet.operator.fillview import parse_time

from ttsfleet.policy import AutoscaleState


def iso(wall_s: float) -> str:
    """Whole UTC seconds, rounded up (a held recommendation never expires early)."""
    return datetime.datetime.fromtimestamp(math.ceil(wall_s), datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class WallClock:
    """Monotonic instants of the policy's state → their wall time, fixed when first seen."""

    walls: dict[float, float] = field(default_factory=dict)

    def wall_of(self, t: float, now: float, wall: float) -> float:
        if t not in self.walls:
            self.walls[t] = wall - (now - t)
        return self.walls[t]

    def keep_only(self, instants: set[float]) -> None:
        self.walls = {t: w for t, w in self.walls.items() if t in instants}


def held(history: tuple[tuple[float, int], ...]) -> list[tuple[float, int]]:
    """The recommendations above every later one (oldest first), the newest excluded."""
    out, best = [], history[-1][1]
    for t, v in reversed(history[:-1]):
        if v > best:
            out.append((t, v))
            best = v
    return out[::-1]


def to_status(state: AutoscaleState, clock: WallClock, now: float, wall: float) -> dict[str, Any]:
    """``status.autoscaler`` for ``state`` (the same dict for the same memory: change-only)."""
    recs, latest, used = [], [], set()
    for pool, history in sorted(state.recommendations.items()):
        if not history:
            continue
        latest.append({"pool": pool, "replicas": int(history[-1][1])})
        for t, v in held(history):
            used.add(t)
            recs.append({"pool": pool, "replicas": int(v), "time": iso(clock.wall_of(t, now, wall))})
    # Lists and an always-present string: a merge patch replaces them whole (a removed pool or an
    # ended panic leaves nothing stale behind that would differ on every step).
    out: dict[str, Any] = {"recommendations": recs, "latest": latest, "panicUntil": "", "lastPanic": ""}
    if state.panic_until is not None:
        used.add(state.panic_until)
        out["panicUntil"] = iso(clock.wall_of(state.panic_until, now, wall))
    if state.last_panic is not None:
        used.add(state.last_panic)
        out["lastPanic"] = iso(clock.wall_of(state.last_panic, now, wall))
    clock.keep_only(used)
    return out


def from_status(stored: Mapping[str, Any], now: float, wall: float) -> tuple[AutoscaleState, WallClock]:
    """The state a restarted operator continues from: held recommendations at their times, each
    pool's newest one as of now, the panic deadline if it is still ahead, the last panic step."""
    clock = WallClock()
    recs: dict[str, list[tuple[float, int]]] = {}
    for r in stored.get("recommendations") or []:
        when = parse_time(r.get("time"))
        if when is None:
            continue
        t = now - (wall - when)
        clock.walls[t] = when
        recs.setdefault(str(r["pool"]), []).append((t, int(r["replicas"])))
    for r in stored.get("latest") or []:
        recs.setdefault(str(r["pool"]), []).append((now, int(r["replicas"])))
    panic = parse_time(stored.get("panicUntil"))
    panic_until = None
    if panic is not None and panic > wall:
        panic_until = now + (panic - wall)
        clock.walls[panic_until] = panic
    last = parse_time(stored.get("lastPanic"))
    last_panic = None
    if last is not None:
        last_panic = now - (wall - last)
        clock.walls[last_panic] = last
    state = dataclasses.replace(AutoscaleState(), panic_until=panic_until, last_panic=last_panic,
                                recommendations={k: tuple(sorted(v)) for k, v in recs.items()})
    return state, clock
