"""The split-K / one-launch kernels' workspaces (:mod:`ttsfleet.kernels.workspaces`).

What each test pins down, and how it can fail:
* an outgrown buffer is kept, not freed (a CUDA graph captured before the growth still writes it:
  freed, its memory would be handed to other tensors);
* a scope's owner gets buffers of its own, apart from the stream's, and scopes nest and unwind;
* tickets come zeroed, at least ``MIN_TICKETS`` of them, and a buffer large enough is reused;
* on a GPU: a scoped capture that needs a buffer its warm-up did not make is refused with a
  message, and an unscoped capture gets buffers no other launch shares.
"""

from __future__ import annotations

import pytest
import torch
from ttsfleet.kernels import workspaces
from ttsfleet.kernels.workspaces import (
    MIN_TICKETS,
    WorkspaceUnderCapture,
    new_owner,
    workspace,
    workspace_scope,
)

CPU = torch.device("cpu")


def test_an_outgrown_workspace_is_kept_for_the_graphs_that_baked_it() -> None:
    with workspace_scope(new_owner("test-grow")):
        part, tickets = workspace(CPU, 100, 10)
        assert part.numel() == 100 and tickets.numel() == MIN_TICKETS and not tickets.any()
        again = workspace(CPU, 50, 10)
        assert again[0] is part and again[1] is tickets  # large enough: the same buffers
        bigger, more = workspace(CPU, 500, 2 * MIN_TICKETS)
    assert bigger.numel() == 500 and more.numel() == 2 * MIN_TICKETS and not more.any()
    assert any(t is part for t in workspaces._KEPT) and any(t is tickets for t in workspaces._KEPT)


def test_a_scope_owns_its_buffers_apart_from_the_stream_and_unwinds() -> None:
    stream_part, _ = workspace(CPU, 64, 1)
    first, second = new_owner("test-a"), new_owner("test-a")
    assert first != second
    with workspace_scope(first):
        a, _ = workspace(CPU, 64, 1)
        with workspace_scope(second):
            b, _ = workspace(CPU, 64, 1)
        assert workspace(CPU, 64, 1)[0] is a  # back in the outer scope
    assert workspace(CPU, 64, 1)[0] is stream_part  # back to the stream's
    assert len({id(stream_part), id(a), id(b)}) == 3


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_captures_never_make_a_shared_workspace() -> None:
    dev = torch.device("cuda")
    graph = torch.cuda.CUDAGraph()
    with (pytest.raises(WorkspaceUnderCapture, match="run the same launches eagerly"),
          workspace_scope(new_owner("test-cold")), torch.cuda.graph(graph)):
        workspace(dev, 1 << 20, 64)
    graph = torch.cuda.CUDAGraph()
    shared = workspace(dev, 1 << 10, 64)  # the capture stream's own, if it had one
    with torch.cuda.graph(graph):
        private = workspace(dev, 1 << 10, 64)
    assert private[0].data_ptr() != shared[0].data_ptr()
    assert all(private[1] is not t for ws in workspaces._WS.values() for t in ws)
