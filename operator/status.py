"""Status helpers: conditions that keep their transition time, and the per-pool replica summary.

Plain functions over plain dicts (the status as stored), so both the reconcile handler and the
autoscaling timer write the same shapes, validated by :mod:`ttsfleet.operator.models`.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Any

HISTORY = 10  # scaling decisions kept in status


def now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def set_conditions(existing: Sequence[Mapping[str, Any]] | None,
                   updates: Mapping[str, tuple[str, str, str]], generation: int,
                   now: str | None = None) -> list[dict[str, Any]]:
    """Merge ``{type: (status, reason, message)}`` into the conditions; the transition time only
    moves when the status changes."""
    now = now or now_iso()
    by_type = {c["type"]: dict(c) for c in existing or []}
    for type_, (st, reason, message) in updates.items():
        old = by_type.get(type_)
        ltt = old["lastTransitionTime"] if old and old.get("status") == st else now
        by_type[type_] = {"type": type_, "status": st, "reason": reason, "message": message[:500],
                          "lastTransitionTime": ltt, "observedGeneration": generation}
    order = ["Ready", "Progressing", "Degraded", "Complete"]
    return sorted(by_type.values(), key=lambda c: (order.index(c["type"]) if c["type"] in order else 9,
                                                   c["type"]))


def pool_status(pool_key: str, gpu_class: str, live: Mapping[str, Any] | None, desired: int | None,
                quantization: str, cuda_graph_max_bs: int) -> dict[str, Any]:
    spec = (live or {}).get("spec") or {}
    st = (live or {}).get("status") or {}
    current = int(spec.get("replicas", 0) or 0)
    return {"name": pool_key, "gpuClass": gpu_class,
            "desired": current if desired is None else desired,
            "current": int(st.get("replicas", 0) or 0) if "replicas" in st else current,
            "ready": int(st.get("readyReplicas", 0) or 0),
            "quantization": quantization, "cudaGraphMaxBs": cuda_graph_max_bs}


def replica_conditions(pools: Sequence[Mapping[str, Any]]) -> dict[str, tuple[str, str, str]]:
    """Ready when every pool has its desired replicas ready; Progressing while any pool moves."""
    lagging = [p for p in pools if p["ready"] < p["desired"] or p["current"] != p["desired"]]
    empty = [p for p in pools if p["desired"] > 0 and p["ready"] == 0]
    if lagging:
        msg = ", ".join(f"{p['name']} {p['ready']}/{p['desired']} ready" for p in lagging)
        progressing = ("True", "ScalingOrRollingOut", msg)
    else:
        progressing = ("False", "Stable", "all pools at their desired replicas")
    total_ready = sum(p["ready"] for p in pools)
    if not lagging:
        ready = ("True", "AllReplicasReady", f"{total_ready} replica(s) ready")
    elif total_ready and not empty:
        ready = ("True", "PartiallyReady", msg)
    else:
        ready = ("False", "ReplicasNotReady", msg)
    return {"Ready": ready, "Progressing": progressing}


def summary(pools: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    return {
        "desiredReplicas": sum(p["desired"] for p in pools),
        "readyReplicas": sum(p["ready"] for p in pools),
        "replicas": sum(p["current"] for p in pools),  # the scale subresource's status.replicas
        "summary": " ".join(f"{p['name']}:{p['ready']}/{p['desired']}" for p in pools),
    }


def append_history(history: Sequence[Mapping[str, Any]] | None,
                   records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [dict(r) for r in [*(history or []), *records]][-HISTORY:]


def already(conditions: Sequence[Mapping[str, Any]] | None, type_: str, status: str, reason: str,
            message: str) -> bool:
    """True when the condition is already recorded as given (so its Event was already posted)."""
    return any(c.get("type") == type_ and c.get("status") == status and c.get("reason") == reason
               and c.get("message") == message[:500] for c in conditions or [])


def changes(current: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of ``new`` that differ from the stored status: a converged object is not
    re-patched (and kopf sends no PATCH at all when nothing is left)."""
    return {k: v for k, v in new.items() if current.get(k) != v}
