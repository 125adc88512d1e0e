"""attnbook.decoding.StaticDecoder, deprecated in 0.3.0: 0.2.0's calls still give the model's own logits."""

import pytest
import torch
from support import tol

from attnbook.decoding import StaticDecoder
from attnbook.lm import DecoderLM
from attnbook.mechanisms import names


@pytest.mark.parametrize("mechanism", names(causal=True))
def test_the_deprecated_decoder_warns_and_gives_the_logits_of_one_forward(mechanism):
    torch.manual_seed(0)
    model = DecoderLM(mechanism, dim=16, n_heads=2).eval()
    tokens = torch.randint(0, 256, (2, 12))
    with pytest.warns(FutureWarning, match="StaticDecoder is deprecated since attnbook 0.3.0"):
        decoder = StaticDecoder(model, batch=2, capacity=12, native=True)
    assert not decoder.native
    with torch.no_grad():
        full = model(tokens)  # (B, N, V)
    torch.testing.assert_close(decoder.prefill(tokens[:, :8]), full[:, :8], **tol(torch.float32))
    for t in range(8, 12):
        torch.testing.assert_close(decoder.step(tokens[:, t]), full[:, t], **tol(torch.float32))
    assert decoder.t == decoder.state().t == 12
    assert decoder.tensors() and all(isinstance(x, torch.Tensor) for x in decoder.tensors())


def test_generate_with_the_deprecated_static_decoder_warns_and_writes_what_eager_writes():
    model = DecoderLM("linear", dim=16, n_heads=2)
    prompt = torch.randint(0, 256, (1, 5))
    with pytest.warns(FutureWarning, match="decoder='static' is deprecated since attnbook 0.3.0"):
        static = model.generate(prompt, 6, temperature=0, decoder="static")
    assert torch.equal(static, model.generate(prompt, 6, temperature=0))


def test_the_deprecated_decoder_still_checks_its_arguments():
    model = DecoderLM("linear", dim=16, n_heads=2)
    with pytest.warns(FutureWarning), pytest.raises(ValueError, match="StaticDecoder: batch must be an int >= 1"):
        StaticDecoder(model, batch=0)
    with pytest.warns(FutureWarning), pytest.raises(TypeError, match="StaticDecoder: model must be a DecoderLM"):
        StaticDecoder(torch.nn.Linear(2, 2))
