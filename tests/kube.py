"""What every test on the local Kubernetes control plane needs first: the binaries, and a started plane.

CI builds the binaries (scripts/test.sh), so a missing build there is a failure, not a skip."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest
from ttsfleet.devtools.localkube import FakeNode, LocalKube, LocalKubeError, missing_binaries

#: Periodic syncs of kube-controller-manager that the tests would otherwise wait out: a PVC pre-bound
#: to its PV turns Bound on the binder's resync (15 s by default: ~14 s of every ``bound_claim``),
#: and the HPA controller reads its metrics every 15 s (the whole of the HPA test's time).
FAST_SYNC = ("--pvclaimbinder-sync-period=1s", "--horizontal-pod-autoscaler-sync-period=2s")


def require_control_plane() -> None:
    """Skip (fail under CI) when the local control plane's binaries are not built."""
    missing = missing_binaries()
    if missing:
        msg = f"local control plane not built (missing {', '.join(missing)}): scripts/kube-local.sh build"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)


@contextmanager
def started(workdir: Path, nodes: Sequence[FakeNode]) -> Iterator[LocalKube]:
    """A started control plane over ``nodes`` (stopped afterwards, also when the start fails)."""
    require_control_plane()
    k = LocalKube(workdir, list(nodes), controller_args=FAST_SYNC)
    try:
        k.start()
    except LocalKubeError:
        k.stop()
        raise
    try:
        yield k
    finally:
        k.stop()
