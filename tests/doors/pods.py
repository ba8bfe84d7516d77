"""A pod's view of its files and environment, built on this machine from the objects a controller
made: what the container process would read, so a door test can hand it to the real reader.

ConfigMap volumes become their files, every other volume an empty directory, each under ``root``
at its mount path; environment values that name a path under a mount are re-rooted the same way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def _configmaps(objects: Sequence[Mapping[str, Any]]) -> dict[str, Mapping[str, str]]:
    return {o["metadata"]["name"]: o.get("data") or {} for o in objects if o.get("kind") == "ConfigMap"}


def materialize(pod_spec: Mapping[str, Any], objects: Sequence[Mapping[str, Any]], root: Path,
                container: int = 0) -> dict[str, str]:
    """Lay out ``container``'s mounts under ``root`` and return its environment as it would see it.

    A ConfigMap volume naming an object not in ``objects`` raises KeyError: the pod would not start.
    """
    configmaps = _configmaps(objects)
    volumes = {v["name"]: v for v in pod_spec.get("volumes") or []}
    c = pod_spec["containers"][container]
    mounts: dict[str, Path] = {}
    for m in c.get("volumeMounts") or []:
        where = root / m["mountPath"].lstrip("/")
        where.mkdir(parents=True, exist_ok=True)
        mounts[m["mountPath"].rstrip("/")] = where
        cm = volumes[m["name"]].get("configMap")
        if cm is not None:
            for key, text in configmaps[cm["name"]].items():
                (where / key).write_text(text)
    env = {}
    for e in c.get("env") or []:
        value = e.get("value", "")
        for path, local in sorted(mounts.items(), key=lambda kv: -len(kv[0])):
            if value == path or value.startswith(path + "/"):
                value = str(local) + value[len(path):]
                break
        env[e["name"]] = value
    return env
