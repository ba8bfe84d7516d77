"""A pod's own network address for processes that share the host's: a wildcard bind is the pod IP.

In a pod, a server bound to ``0.0.0.0`` listens on the pod's own interface only. Here every pod is
a process on one machine, so two inference servers on ``0.0.0.0:8000`` would collide, and a
server that followed the pod's env (``TTSFLEET_HOST=0.0.0.0``) would answer on every pod's
address. :mod:`ttsfleet.devtools.kubelet` gives each pod a loopback address of its own
(``127.X.Y.Z``: Linux routes all of 127/8 to ``lo``) and installs this module as
``sitecustomize`` on each container's ``PYTHONPATH`` with :data:`POD_IP_ENV` set, so in every
Python process of the pod ``socket.bind`` of a wildcard address (``0.0.0.0``, ``""``, ``::``)
binds the pod's address instead, as the pod's network namespace would make it. The containers'
commands stay exactly what the operator wrote; nothing else about sockets changes. Containers
that are not Python are not covered (none of ttsfleet's are).

It is a plain module so it can be tested and read; :func:`install_file` copies it to the name
``sitecustomize.py``, and at import it then chains to the ``sitecustomize`` it shadows (Debian's).
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import importlib.util
import os
import shutil
import socket
import sys
from pathlib import Path
from typing import Any

POD_IP_ENV = "TTSFLEET_DEVTOOLS_POD_IP"
WILDCARDS = frozenset({"0.0.0.0", "", "::", "::0"})


def pod_address(address: Any, family: int, pod_ip: str) -> Any:
    """``address`` with a wildcard host replaced by the pod's IP (IPv4-mapped on an IPv6 socket)."""
    if not isinstance(address, tuple) or not address or address[0] not in WILDCARDS:
        return address
    if family == socket.AF_INET:
        return (pod_ip, *address[1:])
    if family == socket.AF_INET6:
        return (f"::ffff:{pod_ip}", *address[1:])
    return address


def install(pod_ip: str) -> None:
    """Make every ``socket.bind`` of this process bind ``pod_ip`` where it asks for a wildcard."""
    original = socket.socket.bind
    if getattr(original, "_ttsfleet_pod_ip", None) is not None:
        return

    def bind(self: socket.socket, address: Any) -> None:
        original(self, pod_address(address, self.family, pod_ip))

    bind._ttsfleet_pod_ip = pod_ip  # type: ignore[attr-defined]
    socket.socket.bind = bind  # type: ignore[method-assign]


def install_file(directory: Path) -> Path:
    """Copy this module to ``directory/sitecustomize.py``; put ``directory`` on ``PYTHONPATH``."""
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / "sitecustomize.py"
    shutil.copyfile(__file__, target)
    return target


def _chain() -> None:
    """Run the ``sitecustomize`` this file shadows (the next one on ``sys.path``), if any."""
    here = str(Path(__file__).resolve().parent)
    rest = [p for p in sys.path if p and str(Path(p).resolve()) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    with contextlib.suppress(Exception):  # a broken site hook must not stop the pod's process
        spec.loader.exec_module(module)


if __name__ == "sitecustomize":
    if os.environ.get(POD_IP_ENV):
        install(os.environ[POD_IP_ENV])
    _chain()
