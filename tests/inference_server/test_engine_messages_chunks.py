"""The engine's chunk sizes: a ramp from the first chunk to the full one, so a listener is not left
without audio between them."""

from __future__ import annotations

import pytest
from ttsfleet.inference.engine_messages import GenerationRequest


@pytest.mark.parametrize(("first", "full", "sizes"), [
    (2, 8, [2, 4, 8, 8, 8]),
    (1, 4, [1, 2, 4, 4, 4]),
    (4, 16, [4, 8, 16, 16, 16]),
    (3, 8, [3, 6, 8, 8, 8]),
    (0, 2, [1, 2, 2, 2, 2]),  # a first chunk of 0 frames still ramps from 1
    (8, 8, [8, 8, 8, 8, 8]),
])
def test_chunks_double_from_the_first_up_to_the_full_size(first: int, full: int, sizes: list[int]):
    req = GenerationRequest(prompt=None, sampling=None, max_new_tokens=100, first_chunk_frames=first,
                            chunk_frames=full)
    assert [req.chunk_frames_after(n) for n in range(5)] == sizes
    assert req.chunk_frames_after(10**6) == full  # no overflow however long the stream
