"""Free loopback ports, for every local daemon the harness starts (and the tests' servers)."""

from __future__ import annotations

import socket
import threading
from collections import deque

#: Ports this process handed out lately. The kernel may give the same free port to two binds in a
#: row once the first socket is closed, and a caller that asks twice before starting anything
#: would then pass one port twice (a clean-clone CI run, 2026-12-03: an operator started with
#: ``--metrics-port`` = ``--health-port`` refused to start and its test timed out).
_ISSUED: deque[int] = deque(maxlen=256)
_LOCK = threading.Lock()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (the kernel picks it), and that
    this process has not handed out among its last 256 ports."""
    with _LOCK:
        for _ in range(64):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = int(s.getsockname()[1])
            if port not in _ISSUED:
                _ISSUED.append(port)
                return port
    raise RuntimeError("no free loopback port that was not handed out lately")
