"""What a container runs, as a local process: argv, environment, working directory, mounts.

Pure functions over the pod object and what the kubelet fetched for it (:class:`PodInputs`:
ConfigMaps, Secrets, the host directories of the pod's volumes), so every rule is testable
without a cluster. The rules are Kubernetes' own where a process can follow them:

* ``command`` + ``args`` with ``$(VAR)`` expanded from the container's env (``$$`` escapes);
  a container without ``command`` cannot run here (the stand-in does not know an image's
  entrypoint) and is refused with a reason;
* env in order: ``value`` (expanded from the variables before it), ``valueFrom`` (``fieldRef``,
  ``resourceFieldRef``, ``configMapKeyRef``, ``secretKeyRef``, ``optional`` honoured), after the
  ``envFrom`` sources; the variables the Kubernetes runtime adds (``HOSTNAME``);
* **mounts** — a process sees the host's filesystem, so a volume cannot appear at its
  ``mountPath``. Instead every argument, env value and the working directory that names a
  mount path (or a path under one) names the volume's host directory: ``--checkpoint
  /checkpoints/job/shard-00000`` runs as ``--checkpoint <pv host path>/job/shard-00000``.
  ``readOnly`` is not enforced. The longest mount path wins;
* the termination message — ``terminationMessagePath`` (``/dev/termination-log``) is a file in
  the pod's sandbox, named like a mount; its text (at most 4096 bytes) becomes the terminated
  state's ``message``, or with ``FallbackToLogsOnError`` the log's tail after a failure;
* the ServiceAccount token — the in-cluster loaders read fixed absolute paths no process can be
  given, so a pod with a token volume gets ``KUBECONFIG`` (server, CA, its own bound token) and
  no ``KUBERNETES_SERVICE_HOST``; the API server still authenticates and authorizes it as the
  pod's ServiceAccount.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SA_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


class ContainerConfigError(ValueError):
    """The container cannot be started as configured (the pod stays Pending with this reason)."""


@dataclass(frozen=True)
class Mount:
    """A volume mount: the path the container expects and the host path that backs it."""

    path: str
    host: str
    read_only: bool = False


@dataclass
class PodInputs:
    """What the kubelet read from the API and prepared on disk for one pod."""

    configmaps: dict[str, dict[str, str]] = field(default_factory=dict)
    secrets: dict[str, dict[str, str]] = field(default_factory=dict)  # decoded values
    volumes: dict[str, str] = field(default_factory=dict)  # volume name -> host directory or file
    kubeconfig: str | None = None  # written when the pod has a ServiceAccount token volume


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: defined variables are replaced, others left as written,
    ``$$`` is a literal ``$``."""
    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return env[name] if name in env else m.group(0)
    return _VAR.sub(sub, text)


def field_ref(pod: Mapping[str, Any], path: str, pod_ip: str) -> str:
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    simple = {"metadata.name": meta.get("name", ""), "metadata.namespace": meta.get("namespace", ""),
              "metadata.uid": meta.get("uid", ""), "spec.nodeName": spec.get("nodeName", ""),
              "spec.serviceAccountName": spec.get("serviceAccountName", ""),
              "status.podIP": pod_ip, "status.podIPs": pod_ip, "status.hostIP": "127.0.0.1",
              "status.hostIPs": "127.0.0.1"}
    if path in simple:
        return str(simple[path])
    m = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
    if m:
        return str((meta.get(m.group(1)) or {}).get(m.group(2), ""))
    raise ContainerConfigError(f"fieldRef {path!r} is not supported")


def _resource_ref(container: Mapping[str, Any], ref: Mapping[str, Any]) -> str:
    kind, _, name = str(ref.get("resource", "")).partition(".")
    value = ((container.get("resources") or {}).get(kind) or {}).get(name)
    return str(value) if value is not None else "0"


def _key_ref(kind: str, ref: Mapping[str, Any], source: Mapping[str, Mapping[str, str]]) -> str | None:
    name, key = ref.get("name", ""), ref.get("key", "")
    data = source.get(name)
    if data is not None and key in data:
        return data[key]
    if ref.get("optional"):
        return None
    raise ContainerConfigError(f"{kind} {name!r} has no key {key!r}" if data is not None
                               else f"{kind} {name!r} not found")


def _from_sources(container: Mapping[str, Any], inputs: PodInputs) -> dict[str, str]:
    env: dict[str, str] = {}
    for src in container.get("envFrom") or []:
        prefix = src.get("prefix", "")
        for kind, store in (("configMapRef", inputs.configmaps), ("secretRef", inputs.secrets)):
            ref = src.get(kind)
            if ref is None:
                continue
            data = store.get(ref.get("name", ""))
            if data is None:
                if ref.get("optional"):
                    continue
                raise ContainerConfigError(f"{kind} {ref.get('name')!r} not found")
            env.update({f"{prefix}{k}": v for k, v in data.items()})
    return env


def container_env(pod: Mapping[str, Any], container: Mapping[str, Any], pod_ip: str,
                  inputs: PodInputs) -> dict[str, str]:
    """The container's environment as Kubernetes defines it (without the host's)."""
    env = {"HOSTNAME": str((pod.get("metadata") or {}).get("name", ""))}
    env.update(_from_sources(container, inputs))
    for var in container.get("env") or []:
        name, src = var["name"], var.get("valueFrom")
        if src is None:
            env[name] = expand(str(var.get("value", "")), env)
            continue
        value: str | None
        if "fieldRef" in src:
            value = field_ref(pod, src["fieldRef"].get("fieldPath", ""), pod_ip)
        elif "resourceFieldRef" in src:
            value = _resource_ref(container, src["resourceFieldRef"])
        elif "configMapKeyRef" in src:
            value = _key_ref("ConfigMap", src["configMapKeyRef"], inputs.configmaps)
        elif "secretKeyRef" in src:
            value = _key_ref("Secret", src["secretKeyRef"], inputs.secrets)
        else:
            raise ContainerConfigError(f"env {name}: valueFrom {sorted(src)} is not supported")
        if value is not None:
            env[name] = value
    return env


TERMINATION_LOG = "/dev/termination-log"
#: The kubelet keeps at most this much of a termination message (Kubernetes: 4096 bytes).
MESSAGE_BYTES = 4096


def termination_message_path(container: Mapping[str, Any]) -> str:
    return str(container.get("terminationMessagePath") or TERMINATION_LOG)


def mounts(pod: Mapping[str, Any], container: Mapping[str, Any], inputs: PodInputs,
           message_file: str | None = None) -> list[Mount]:
    """The container's mounts, longest path first (the one that wins for a nested path); with
    ``message_file``, its ``terminationMessagePath`` is one too (the kubelet reads it at exit)."""
    out = [Mount(termination_message_path(container), message_file)] if message_file else []
    for vm in container.get("volumeMounts") or []:
        host = inputs.volumes.get(vm["name"])
        if host is None:
            raise ContainerConfigError(f"volume {vm['name']!r} is not prepared")
        if vm.get("subPath"):
            host = str(Path(host) / vm["subPath"])
        out.append(Mount(vm["mountPath"].rstrip("/") or "/", host, bool(vm.get("readOnly"))))
    return sorted(out, key=lambda m: len(m.path), reverse=True)


def host_path(value: str, table: Sequence[Mount]) -> str:
    """``value`` with a leading mount path (``/data`` or ``/data/...``, also after ``--flag=``)
    replaced by its host directory; anything else unchanged."""
    head, eq, tail = value.partition("=") if value.startswith("-") and "=" in value else ("", "", value)
    for m in table:
        if tail == m.path or tail.startswith(m.path + "/"):
            return head + eq + m.host + tail[len(m.path):]
    return value


def resolve_argv(container: Mapping[str, Any], env: Mapping[str, str], table: Sequence[Mount]) -> list[str]:
    """``command`` + ``args``, expanded and with mount paths on the host; argv[0] found on PATH."""
    command = list(container.get("command") or [])
    if not command:
        raise ContainerConfigError(f"container {container.get('name')!r} has no command: this kubelet "
                                   "runs commands, it cannot know an image's entrypoint")
    argv = [host_path(expand(str(a), env), table) for a in [*command, *(container.get("args") or [])]]
    exe = argv[0] if "/" in argv[0] else shutil.which(argv[0], path=env.get("PATH"))
    if exe is None or not os.access(exe, os.X_OK):
        raise ContainerConfigError(f"executable {argv[0]!r} not found on PATH")
    return [exe, *argv[1:]]


def process_env(base: Mapping[str, str], pod_env: Mapping[str, str], table: Sequence[Mount],
                inputs: PodInputs) -> dict[str, str]:
    """The process environment: the "image's" (``base``: PATH, locale, ...) under the pod's, with
    mount paths on the host, and the kubeconfig standing in for the token mount."""
    env = dict(base)
    env.update({k: host_path(v, table) for k, v in pod_env.items()})
    if inputs.kubeconfig and "KUBECONFIG" not in pod_env:
        env["KUBECONFIG"] = inputs.kubeconfig
    for key in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
        env.pop(key, None)
    return env


def working_dir(container: Mapping[str, Any], table: Sequence[Mount], default: Path) -> Path:
    wd = container.get("workingDir")
    return Path(host_path(wd, table)) if wd else default


def port_number(container: Mapping[str, Any], port: int | str) -> int:
    """A probe's port: a number, or the name of one of the container's ports."""
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    for p in container.get("ports") or []:
        if p.get("name") == port:
            return int(p["containerPort"])
    raise ContainerConfigError(f"container {container.get('name')!r} has no port named {port!r}")
