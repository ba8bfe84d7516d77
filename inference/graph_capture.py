"""One CUDA graph capture at a time per process.

The engine thread captures the decode graphs while the codec thread captures its own and warms up
cuDNN. A capture in CUDA's default ("global") mode is invalidated by an unsafe call from any other
thread (an allocation, cuDNN's benchmark sync), and a thread-local capture is still broken by work
that syncs with the capturing stream. Measured on the H200 (2026-12-02, run2-served-fast): with
both threads capturing at start, the decode capture failed and the server decoded eagerly at a
third of its speed. So every capture, and the codec's set-up around it, holds this lock.
"""

from __future__ import annotations

import threading

CAPTURE_LOCK = threading.Lock()
