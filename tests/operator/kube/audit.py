"""Reading the API server's audit log: what the operator's ServiceAccount actually asked for."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ttsfleet.devtools.localkube import LocalKube


def sa_user(namespace: str, name: str) -> str:
    return f"system:serviceaccount:{namespace}:{name}"


def requests(kube: LocalKube, user: str, since: int = 0) -> list[dict[str, Any]]:
    """Completed requests by ``user`` from audit line ``since`` on (a watch counts once)."""
    return [e for e in kube.audit_events()[since:]
            if e.get("user", {}).get("username") == user and e.get("stage") in ("ResponseComplete",
                                                                                 "ResponseStarted")
            and not (e.get("stage") == "ResponseStarted" and e.get("verb") != "watch")]


def mark(kube: LocalKube) -> int:
    return len(kube.audit_events())


def call(e: dict[str, Any]) -> tuple[str, str, str, bool]:
    """(apiGroup, resource[/subresource], verb, namespaced) of one audit event."""
    ref = e.get("objectRef") or {}
    res = ref.get("resource", "")
    if ref.get("subresource"):
        res = f"{res}/{ref['subresource']}"
    return ref.get("apiGroup", ""), res, e["verb"], bool(ref.get("namespace"))


def writes(events: Iterable[dict[str, Any]]) -> list[str]:
    """Every mutating request, readable: ``patch apps/deployments ns/name``."""
    out = []
    for e in events:
        if e["verb"] in ("create", "update", "patch", "delete", "deletecollection"):
            ref = e.get("objectRef") or {}
            out.append(f"{e['verb']} {ref.get('apiGroup', '')}/{ref.get('resource')}"
                       f"{'/' + ref['subresource'] if ref.get('subresource') else ''} "
                       f"{ref.get('namespace', '')}/{ref.get('name', '')}")
    return out


def forbidden(events: Iterable[dict[str, Any]]) -> list[str]:
    return [f"{e['verb']} {e.get('requestURI')}" for e in events
            if (e.get("responseStatus") or {}).get("code") == 403]
