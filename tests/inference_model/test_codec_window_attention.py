"""The codec decoder's window attention backend in batched pushes (issue #25,
``TTSFLEET_CODEC_WINDOW_ATTENTION``, default ``efficient`` on CUDA).

What each test pins down, and how it can fail:
* the switch's names are ``auto`` and exactly the backends ``codec_layers`` knows (the list is spelled
  out in ``codec_batch`` so that module imports without torch; a backend added on one side only fails);
* ``Codec.use_window_attention`` reaches every window transformer and SDPA itself: on the CPU, the
  ``flash`` backend (which the CPU has) decodes what torch's own choice decodes, while ``cudnn`` (which
  it has not) makes the push fail — were the knob not applied, the push would succeed;
* the slot decoder the server builds takes the switch's backend on CUDA only: on the CPU, torch's own
  choice (the switch names GPU kernels), whatever the switch says.
"""

from __future__ import annotations

import pytest
import torch
from ttsfleet.inference import codec_batch, codec_layers
from ttsfleet.inference.codec import load_codec
from ttsfleet.inference.codec_process import DecoderPlan


@pytest.fixture
def codec(golden_dir):  # noqa: ANN001, ANN201
    return load_codec(golden_dir / "codec-tiny" / "codec.pth")


@pytest.fixture
def window_switch():  # noqa: ANN201
    yield codec_batch.CODEC_WINDOW_ATTENTION_SWITCH
    codec_batch.CODEC_WINDOW_ATTENTION_SWITCH.reset()


def _windows(c) -> list[codec_layers.WindowTransformer]:  # noqa: ANN001
    return [m for m in c.modules() if isinstance(m, codec_layers.WindowTransformer)]


def _pushes() -> list[tuple[list[int], torch.Tensor]]:
    g = torch.Generator().manual_seed(3)
    return [(slots, torch.randint(0, 16, (len(slots), 10, t), generator=g))
            for slots, t in [([0, 2], 1), ([0, 1, 2], 4), ([1, 2], 2)]]


def _decode(c, backend: str) -> list[torch.Tensor]:  # noqa: ANN001
    c.use_window_attention(backend)
    dec = c.slot_decoder(4)
    return [dec.push(slots, codes) for slots, codes in _pushes()]


def test_the_switch_names_auto_and_every_backend_codec_layers_knows() -> None:
    assert ("auto", *codec_layers.SDPA_BACKENDS) == codec_batch.CODEC_WINDOW_ATTENTIONS
    assert codec_batch.CODEC_WINDOW_ATTENTION_SWITCH.default == "efficient"


def test_the_backend_reaches_every_window_transformer_and_sdpa(codec) -> None:  # noqa: ANN001
    assert _windows(codec), "the tiny codec has window transformers"
    reference = _decode(codec, "auto")
    assert all(m.slot_sdpa is None for m in _windows(codec))
    flash = _decode(codec, "flash")
    assert all(m.slot_sdpa == "flash" for m in _windows(codec))
    for a, b in zip(flash, reference, strict=True):
        assert b.abs().max() > 0.01
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    with pytest.raises(RuntimeError, match="No viable backend"):
        _decode(codec, "cudnn")  # not on a CPU: the knob reached SDPA


def test_an_unknown_backend_is_one_line_naming_the_choices(codec) -> None:  # noqa: ANN001
    with pytest.raises(ValueError, match="^window attention backend 'flex': expected auto or one of cudnn, "
                                         "efficient, flash, math$"):
        codec.use_window_attention("flex")


def test_the_served_decoder_takes_the_switch_on_cuda_only(codec, window_switch) -> None:  # noqa: ANN001
    window_switch.set("math")
    assert codec_batch.window_attention_for(torch.device("cuda", 0)) == "math"
    assert codec_batch.window_attention_for(torch.device("cpu")) == "auto"
    plan = DecoderPlan(slots=4, max_seq_len=64, graphs=False, graph_max_batch=4, compile_mode=None,
                       max_frames=2)
    codec_batch.build_slot_decoder(codec, plan)
    assert all(m.slot_sdpa is None for m in _windows(codec))
