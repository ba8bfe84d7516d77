"""Reconcile by diff: create what is missing, merge-patch what drifted, leave the rest alone.

The desired object is compared as a *subset* of the live one, so fields the API server defaults
(``terminationMessagePath``, ``clusterIP``...) never count as drift. Fields another loop owns
(``spec.replicas`` belongs to the autoscaler) are left out of patches. Creation is idempotent: a
409 from a previous, interrupted reconcile turns into a patch, so a restart never duplicates.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any, Literal

from ttsfleet.operator.kube import Kube, KubeError, obj_path

Outcome = Literal["created", "patched", "unchanged"]


class NotOwned(RuntimeError):
    """An object with the desired name exists but another controller (or nobody) owns it: it is
    left alone, never adopted or overwritten."""


def controllers(obj: dict[str, Any] | None) -> set[str]:
    """UIDs of the object's controlling owner references."""
    refs = ((obj or {}).get("metadata") or {}).get("ownerReferences") or []
    return {str(r.get("uid")) for r in refs if r.get("controller")}


def owned(desired: dict[str, Any], live: dict[str, Any]) -> bool:
    """True when ``live`` is controlled by the owner ``desired`` names (or desired names none)."""
    want = controllers(desired)
    return not want or bool(want & controllers(live))


def is_subset(desired: Any, live: Any) -> bool:
    """True when every field of ``desired`` is present in ``live`` with the same value."""
    if isinstance(desired, dict):
        return isinstance(live, dict) and all(k in live and is_subset(v, live[k])
                                              for k, v in desired.items())
    if isinstance(desired, list):
        return (isinstance(live, list) and len(desired) == len(live)
                and all(is_subset(d, x) for d, x in zip(desired, live, strict=True)))
    return desired == live


def without(obj: dict[str, Any], fields: Iterable[tuple[str, ...]]) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    for f in fields:
        node = out
        for key in f[:-1]:
            node = node.get(key, {})
        node.pop(f[-1], None)
    return out


#: Maps the operator owns entirely: keys found live but not desired are removed (a merge patch
#: alone would keep them, e.g. a stale Service selector key).
EXACT_MAPS: dict[str, tuple[tuple[str, ...], ...]] = {
    "Service": (("spec", "selector"),),
    "Deployment": (("spec", "template", "spec", "nodeSelector"),),
}


def _get(obj: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def _stale_keys(desired: dict[str, Any], live: dict[str, Any]) -> dict[tuple[str, ...], list[str]]:
    out = {}
    for p in EXACT_MAPS.get(desired.get("kind", ""), ()):
        want, have = _get(desired, p), _get(live, p)
        want = {} if want is None else want  # left out because empty (the server drops `{}`)
        if isinstance(want, dict) and isinstance(have, dict) and (extra := sorted(set(have) - set(want))):
            out[p] = extra
    return out


def patch_for(desired: dict[str, Any], live: dict[str, Any] | None,
              owned_elsewhere: Iterable[tuple[str, ...]] = ()) -> dict[str, Any] | None:
    """The merge patch that brings ``live`` to ``desired``, or None when nothing drifted."""
    if live is None:
        return None
    stale = _stale_keys(desired, live)
    want = without(desired, owned_elsewhere)
    want.pop("apiVersion", None)
    want.pop("kind", None)
    if is_subset(want, live) and not stale:
        return None
    want["metadata"] = {k: v for k, v in want.get("metadata", {}).items()
                        if k in ("labels", "annotations", "ownerReferences")}
    for p, keys in stale.items():
        node = want
        for key in p:
            node = node.setdefault(key, {})
        for k in keys:
            node[k] = None  # merge-patch null: delete the key
    return want


async def apply(kube: Kube, desired: dict[str, Any],
                owned_elsewhere: Iterable[tuple[str, ...]] = ()) -> Outcome:
    """Create or merge-patch one object so that it contains ``desired``."""
    url = obj_path(desired)
    owned_fields = list(owned_elsewhere)
    live = await kube.get(url)
    if live is None:
        try:
            await kube.create(obj_path(desired, named=False), desired)
            return "created"
        except KubeError as exc:
            if exc.status != 409:
                raise
            live = await kube.get(url)  # created by an earlier, interrupted pass
    if live is not None and not owned(desired, live):
        meta = live["metadata"]
        raise NotOwned(f"{desired['kind']} {meta['name']} exists and is not ours "
                       f"(controller: {', '.join(sorted(controllers(live))) or 'none'}); left alone")
    patch = patch_for(desired, live, owned_fields)
    if patch is None:
        return "unchanged"
    await kube.patch(url, patch)
    return "patched"


async def delete_if_owned(kube: Kube, url: str, owner_uid: str) -> bool:
    """Delete the object at ``url`` only when ``owner_uid`` controls it (a same-named object of
    someone else survives); False when it was gone or not ours."""
    live = await kube.get(url)
    if live is None or owner_uid not in controllers(live):
        return False
    return await kube.delete(url)
