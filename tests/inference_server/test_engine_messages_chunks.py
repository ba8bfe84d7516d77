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


def test_without_the_ramp_the_second_chunk_is_full_size():
    req = GenerationRequest(prompt=None, sampling=None, max_new_tokens=100, first_chunk_frames=1,
                            chunk_frames=4)
    assert [req.chunk_frames_after(n, ramp="off") for n in range(3)] == [1, 4, 4]


@pytest.mark.parametrize(("first", "full", "sizes"), [
    (1, 4, [1, 1, 2, 4, 4, 4]),
    (2, 8, [2, 2, 4, 8, 8, 8]),
    (8, 8, [8, 8, 8, 8, 8, 8]),
])
def test_repeat_first_sends_the_first_size_twice_then_doubles(first: int, full: int, sizes: list[int]):
    req = GenerationRequest(prompt=None, sampling=None, max_new_tokens=100, first_chunk_frames=first,
                            chunk_frames=full)
    assert [req.chunk_frames_after(n, ramp="repeat-first") for n in range(6)] == sizes
    assert req.chunk_frames_after(10**6, ramp="repeat-first") == full


def test_the_ramp_switch_reads_its_forms_and_refuses_anything_else(monkeypatch: pytest.MonkeyPatch):
    from ttsfleet.inference.engine_messages import CHUNK_RAMP_ENV, CHUNK_RAMP_SWITCH

    monkeypatch.setenv(CHUNK_RAMP_ENV, "OFF")
    CHUNK_RAMP_SWITCH.reset()
    try:
        assert CHUNK_RAMP_SWITCH.get() == "off"
        monkeypatch.setenv(CHUNK_RAMP_ENV, "sometimes")
        CHUNK_RAMP_SWITCH.reset()
        expected = "TTSFLEET_CHUNK_RAMP='sometimes': expected one of on, off, repeat-first"
        with pytest.raises(ValueError, match=expected):
            CHUNK_RAMP_SWITCH.get()
    finally:
        monkeypatch.delenv(CHUNK_RAMP_ENV)
        CHUNK_RAMP_SWITCH.reset()
    assert CHUNK_RAMP_SWITCH.get() == "on"
