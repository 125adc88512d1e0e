"""The recurrent and prefill API, in flash-linear-attention's convention: a prompt prefilled in one parallel call
and continued one token at a time gives exactly the outputs of one causal forward over the whole sequence.

* functions: causal ``linear_attention`` and ``flow_attention`` with ``initial_state=`` and
  ``output_final_state=True`` (-> ``(output, final_state)``), chunk by chunk, against one call and against the
  float64 references, gradients through the state included;
* layers: every causal layer's ``forward(x, initial_state=..., output_final_state=True)`` and ``step(x_t, state)``;
* a padded prompt (left padding, as batched generation pads) continued by steps;
* the language model: ``DecoderLM.forward`` with a state, ``step``, and ``generate``, which prefills.
"""

import pytest
import torch
from support import qkv, tol

import attnbook
from attnbook import reference
from attnbook.lm import DecoderLM, LMState
from attnbook.mechanisms import MECHANISMS

CAUSAL = [n for n, m in MECHANISMS.items() if m.causal]  # softmax, linear, flow, moh
STATEFUL_FUNCTIONS = ["linear", "flow"]


@pytest.mark.parametrize("cuts", [(5,), (1, 2, 3), (16, 17), (31,)], ids=lambda c: "-".join(map(str, c)))
@pytest.mark.parametrize("name", STATEFUL_FUNCTIONS)
def test_a_function_in_pieces_through_its_state_equals_one_call(name, cuts):
    fn = MECHANISMS[name].function
    q, k, v = qkv(2, 3, 40, 40, 6, 5, dtype=torch.float64)
    whole = fn(q, k, v, is_causal=True, chunk_size=8)
    pieces, state, start = [], None, 0
    for stop in (*cuts, 40):
        out, state = fn(
            q[:, :, start:stop], k[:, :, start:stop], v[:, :, start:stop], is_causal=True, chunk_size=8,
            initial_state=state, output_final_state=True,
        )  # fmt: skip
        pieces.append(out)
        start = stop
    torch.testing.assert_close(torch.cat(pieces, dim=2), whole, **tol(torch.float64))
    torch.testing.assert_close(whole, getattr(reference, f"{name}_attention")(q, k, v, is_causal=True))


@pytest.mark.parametrize("name", STATEFUL_FUNCTIONS)
def test_the_final_state_is_the_one_the_steps_reach(name):
    fn, step = MECHANISMS[name].function, MECHANISMS[name].step
    q, k, v = qkv(2, 3, 11, 11, 4, 4, dtype=torch.float64)
    _, final = fn(q, k, v, is_causal=True, output_final_state=True)
    state = None
    for t in range(11):
        _, state = step(q[:, :, t], k[:, :, t], v[:, :, t], state)
    for field, a, b in zip(type(final)._fields, final, state, strict=True):
        torch.testing.assert_close(a, b, **tol(torch.float64), msg=lambda m, field=field: f"{field}: {m}")


@pytest.mark.parametrize("name", STATEFUL_FUNCTIONS)
def test_gradients_flow_through_the_state(name):
    """The second piece's output depends on the first piece's keys and values only through the state: its
    gradients with respect to them equal those of one call."""
    fn = MECHANISMS[name].function
    q, k, v = (x.requires_grad_() for x in qkv(1, 2, 12, 12, 4, 4, dtype=torch.float64))
    w = torch.randn(1, 2, 5, 4, dtype=torch.float64)
    _, state = fn(q[:, :, :7], k[:, :, :7], v[:, :, :7], is_causal=True, output_final_state=True)
    tail = fn(q[:, :, 7:], k[:, :, 7:], v[:, :, 7:], is_causal=True, initial_state=state)
    got = torch.autograd.grad((tail * w).sum(), (q, k, v))
    expected = torch.autograd.grad((fn(q, k, v, is_causal=True)[:, :, 7:] * w).sum(), (q, k, v))
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, **tol(torch.float64))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("name", CAUSAL)
def test_prefill_then_steps_equal_one_forward_for_every_causal_layer(name, dtype):
    torch.manual_seed(0)
    layer = MECHANISMS[name].module(24, 4, causal=True).to(dtype).eval()
    x = torch.randn(2, 13, 24, dtype=dtype)
    whole = layer(x)
    y, state = layer(x[:, :6], output_final_state=True)
    parts = [y]
    y, state = layer(x[:, 6:9], initial_state=state, output_final_state=True)  # a second prefill
    parts.append(y)
    for t in range(9, 13):
        y_t, state = layer.step(x[:, t], state)
        parts.append(y_t.unsqueeze(1))
    torch.testing.assert_close(torch.cat(parts, dim=1), whole, **tol(dtype))
    stepped, state = [], None  # and from nothing, one token at a time
    for t in range(13):
        y_t, state = layer.step(x[:, t], state)
        stepped.append(y_t)
    torch.testing.assert_close(torch.stack(stepped, 1), whole, **tol(dtype))


@pytest.mark.parametrize("name", CAUSAL)
def test_a_left_padded_prompt_continues_like_each_sequence_alone(name):
    """Batched generation pads prompts of different lengths on the left; prefill with key_padding_mask, then
    steps: each sequence's outputs are those of its own unpadded run."""
    torch.manual_seed(0)
    layer = MECHANISMS[name].module(16, 4, causal=True).double().eval()
    lengths, P = [6, 3], 6
    x = torch.randn(2, P + 3, 16, dtype=torch.float64)
    padding = torch.zeros(2, P, dtype=torch.bool)
    padding[1, : P - lengths[1]] = True
    _, state = layer(x[:, :P], key_padding_mask=padding, output_final_state=True)
    steps = []
    for t in range(P, P + 3):
        y_t, state = layer.step(x[:, t], state)
        steps.append(y_t)
    steps = torch.stack(steps, 1)  # (2, 3, 16)
    for i, n in enumerate(lengths):
        alone = layer(x[i : i + 1, P - n :])[:, n:]  # the sequence without its padding, its last 3 tokens
        torch.testing.assert_close(steps[i : i + 1], alone, **tol(torch.float64))


def test_a_state_needs_a_causal_self_attention_call():
    layer = attnbook.LinearAttention(8, 8, 8, 2)
    with pytest.raises(ValueError, match=r"a call with a state .* must be causal"):
        layer(torch.randn(1, 3, 8), output_final_state=True)
    y, state = layer(torch.randn(1, 3, 8), is_causal=True, output_final_state=True)  # is_causal per call
    assert isinstance(state, attnbook.LinearState) and state.S.shape == (1, 2, 4, 4)


@pytest.mark.parametrize("name", CAUSAL)
def test_the_language_model_prefills_steps_and_generates_through_the_layers_state(name):
    torch.manual_seed(0)
    model = DecoderLM(name, dim=16, n_heads=2, n_layers=2).double().eval()
    tokens = torch.randint(0, 256, (2, 12))
    whole = model(tokens)
    logits, state = model(tokens[:, :5], output_final_state=True)
    assert isinstance(state, LMState) and state.t == 5
    parts = [logits]
    logits, state = model(tokens[:, 5:8], initial_state=state, output_final_state=True)
    parts.append(logits)
    for t in range(8, 12):
        step_logits, state = model.step(tokens[:, t], state)
        parts.append(step_logits.unsqueeze(1))
    torch.testing.assert_close(torch.cat(parts, 1), whole, **tol(torch.float64))
    for decoder in ("static", "eager"):
        out = model.generate(tokens[:, :4], 6, temperature=0, decoder=decoder)
        expected = tokens[:, :4]
        for _ in range(6):  # greedy decoding by hand: one whole forward per token
            expected = torch.cat([expected, model(expected)[:, -1].argmax(-1, keepdim=True)], 1)
        assert torch.equal(out, expected), decoder


def test_a_softmax_layer_continues_a_cache_without_returning_one():
    """0.2.0 returned (out, cache) from a causal call with initial_state but without output_final_state, and the
    layer failed with "'tuple' object has no attribute 'shape'"."""
    layer = attnbook.SoftmaxAttention(8, 8, 8, 2, causal=True).eval()
    x = torch.randn(2, 6, 8)
    _, cache = layer(x[:, :4], output_final_state=True)
    tail = layer(x[:, 4:], initial_state=cache)
    torch.testing.assert_close(tail, layer(x)[:, 4:], **tol(torch.float32))
