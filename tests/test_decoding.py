"""attnbook.decoding.StaticDecoder: the state allocated once and updated in place gives the logits of the
teaching path (DecoderLM.step) and of one whole forward, for every causal mechanism, and says what is wrong."""

import gc

import pytest
import torch
from support import tol

from attnbook.decoding import StaticDecoder
from attnbook.lm import DecoderLM
from attnbook.mechanisms import MECHANISMS

CAUSAL = [n for n, m in MECHANISMS.items() if m.causal]


def model(name, dtype=torch.float64, **kwargs):
    torch.manual_seed(0)
    return DecoderLM(name, dim=24, n_heads=4, n_layers=2, **kwargs).to(dtype).eval()


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("name", CAUSAL)
def test_prefill_and_steps_give_the_logits_of_one_forward(name, batch):
    m = model(name)
    tokens = torch.randint(0, 256, (batch, 30))
    decoder = StaticDecoder(m, batch=batch, capacity=30)
    parts = [decoder.prefill(tokens[:, :11])]
    for t in range(11, 30):
        parts.append(decoder.step(tokens[:, t]).unsqueeze(1))
    torch.testing.assert_close(torch.cat(parts, 1), m(tokens), **tol(torch.float64))
    assert decoder.t == 30


@pytest.mark.parametrize("up_to", [0, 10_000], ids=["batched-products", "sdpa"])
@pytest.mark.parametrize("name", ["softmax", "moh"])
def test_both_ways_of_reading_a_kv_cache_give_the_logits_of_one_forward(name, up_to, monkeypatch):
    """On the CPU a long cache is read by two batched products, a short one by SDPA (decoding._SDPA_UP_TO keys):
    the threshold moved so that each path reads every step."""
    import attnbook.decoding

    monkeypatch.setattr(attnbook.decoding, "_SDPA_UP_TO", up_to)
    m = model(name)
    tokens = torch.randint(0, 256, (2, 25))
    decoder = StaticDecoder(m, batch=2, capacity=25)
    parts = [decoder.prefill(tokens[:, :5])] + [decoder.step(tokens[:, t]).unsqueeze(1) for t in range(5, 25)]
    torch.testing.assert_close(torch.cat(parts, 1), m(tokens), **tol(torch.float64))


def _variant(kind, dim=24, n_heads=4):
    from attnbook import FlowAttention, LinearAttention
    from attnbook.feature_maps import PerformerFeatures

    size = dict(d_input=dim, d_model=dim, d_output=dim, n_heads=n_heads, causal=True)
    if kind == "relu":
        return LinearAttention(**size, feature_map="relu")
    if kind == "performer":  # 10 features of each width-6 head: not elementwise, R != D
        return LinearAttention(**size, feature_map=PerformerFeatures(10, 6, seed=0))
    return FlowAttention(**size, drop_out=0.0, **{kind: False})


@pytest.mark.parametrize("kind", ["relu", "performer", "competition", "allocation"])
def test_layers_swapped_into_a_model_step_as_their_forward(kind):
    """A block's attention replaced by another feature map or by a Flow ablation: the decoder's own step paths
    (q and k features in one call, a feature map of another width, no competition or no allocation) give the
    logits of one forward."""
    m = model("flow" if kind in ("competition", "allocation") else "linear")
    torch.manual_seed(1)
    for block in m.blocks:
        block.attn = _variant(kind).double().eval()
    tokens = torch.randint(0, 256, (2, 20))
    decoder = StaticDecoder(m, batch=2, capacity=20)
    parts = [decoder.prefill(tokens[:, :7])] + [decoder.step(tokens[:, t]).unsqueeze(1) for t in range(7, 20)]
    torch.testing.assert_close(torch.cat(parts, 1), m(tokens), **tol(torch.float64))
    nxt = torch.randint(0, 256, (2,))
    _, expected = m(tokens, output_final_state=True)
    torch.testing.assert_close(m.step(nxt, decoder.state())[0], m.step(nxt, expected)[0], **tol(torch.float64))


@pytest.mark.parametrize("name", CAUSAL)
def test_its_state_is_the_one_the_eager_steps_reach(name):
    m = model(name)
    tokens = torch.randint(0, 256, (2, 9))
    decoder = StaticDecoder(m, batch=2, capacity=16)
    decoder.prefill(tokens[:, :4])
    for t in range(4, 9):
        decoder.step(tokens[:, t])
    _, expected = m(tokens, output_final_state=True)
    held = decoder.state()
    assert held.t == expected.t == 9
    nxt = torch.randint(0, 256, (2,))
    torch.testing.assert_close(m.step(nxt, held)[0], m.step(nxt, expected)[0], **tol(torch.float64))


@pytest.mark.parametrize("name", ["linear", "flow", "softmax"])
def test_float32_and_bfloat16_models(name):
    for dtype in (torch.float32, torch.bfloat16):
        m = model(name, dtype)
        tokens = torch.randint(0, 256, (1, 12))
        decoder = StaticDecoder(m, capacity=12)
        decoder.prefill(tokens[:, :8])
        got = torch.stack([decoder.step(tokens[:, t]) for t in range(8, 12)], 1)
        torch.testing.assert_close(got.double(), m(tokens)[:, 8:].double(), **tol(dtype))


def test_reset_starts_afresh_and_capacity_is_a_clear_limit():
    m = model("softmax")
    decoder = StaticDecoder(m, capacity=4)
    tokens = torch.randint(0, 256, (1, 4))
    first = [decoder.step(tokens[:, t]) for t in range(4)]
    with pytest.raises(ValueError, match=r"StaticDecoder.step: the number of tokens must be an int <= 4 \(the "):
        decoder.step(tokens[:, 0])
    decoder.reset()
    torch.testing.assert_close(decoder.step(tokens[:, 0]), first[0])
    with pytest.raises(ValueError, match=r"prefill: the prompt's length must be an int <= 4"):
        decoder.prefill(torch.randint(0, 256, (1, 5)))
    with pytest.raises(ValueError, match=r"prefill: the prompt's batch size must be 1"):
        decoder.prefill(torch.randint(0, 256, (2, 3)))
    with pytest.raises(TypeError, match=r"StaticDecoder: model must be a DecoderLM"):
        StaticDecoder(torch.nn.Linear(2, 2))


@pytest.mark.slow
def test_the_compiled_step_gives_the_same_logits():
    """torch.compile of the step, fixed shapes (the position a tensor, the KV cache read whole and masked), for
    every causal mechanism (bench_decoding records each compiled step)."""
    for name in CAUSAL:
        torch._dynamo.reset()
        m = DecoderLM(name, dim=16, n_heads=2, n_layers=1).eval()
        tokens = torch.randint(0, 256, (1, 10))
        plain, compiled = StaticDecoder(m, capacity=10), StaticDecoder(m, capacity=10, compile=True)
        plain.prefill(tokens[:, :6])
        compiled.prefill(tokens[:, :6])
        for t in range(6, 10):
            torch.testing.assert_close(compiled.step(tokens[:, t]), plain.step(tokens[:, t]), **tol(torch.float32))


class _Writes(torch.utils._python_dispatch.TorchDispatchMode):
    """The storages of every tensor an operator writes in place (or into through ``out=``)."""

    def __init__(self):
        super().__init__()
        self.written = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for i, arg in enumerate(func._schema.arguments):  # positional by index, keyword (out=) by name
            value = args[i] if i < len(args) else kwargs.get(arg.name)
            if arg.alias_info is not None and arg.alias_info.is_write and isinstance(value, torch.Tensor):
                self.written.add(value.untyped_storage().data_ptr())
        return func(*args, **kwargs)


@pytest.mark.parametrize("name", CAUSAL)
def test_every_tensor_a_step_writes_is_one_it_declares_static(name):
    """On CUDA the compiled step is a CUDA graph only if every tensor it writes in place is marked static
    (StaticDecoder._tensors, each passed to torch._dynamo.mark_static_address): a state buffer left out would
    make inductor skip the graph again ("mutated inputs", as on the H200)."""
    decoder = StaticDecoder(model(name, torch.float32), batch=2, capacity=40, native=False)  # torch's operations
    decoder.prefill(torch.randint(0, 256, (2, 5)))
    declared = {t.untyped_storage().data_ptr() for t in decoder._tensors()}
    held = {t.untyped_storage().data_ptr() for t in decoder.tensors()}
    assert held <= declared
    alive = [t for t in gc.get_objects() if type(t) in (torch.Tensor, torch.nn.Parameter)]  # type(): no lookups
    before = {t.untyped_storage().data_ptr() for t in alive}
    with _Writes() as mode:
        decoder.step(torch.randint(0, 256, (2,)))
    persistent = {ptr for ptr in mode.written if ptr in before}  # not a temporary of the step
    assert persistent and persistent <= declared


# -- the native step (_step.c) --------------------------------------------------------------------------------

NATIVE = ["linear", "flow", "softmax", "moh", "relu", "competition", "allocation"]


def _moh(dim, n_heads, shared, routed, **kwargs):
    from attnbook import MoHAttention

    return MoHAttention(dim, n_heads, qkv_bias=True, causal=True, shared_head=shared, routed_head=routed, **kwargs)


def _native_model(kind, dim, n_heads):
    name = {"relu": "linear", "competition": "flow", "allocation": "flow"}.get(kind, kind)
    torch.manual_seed(0)
    m = DecoderLM(name, dim=dim, n_heads=n_heads, n_layers=2).eval()
    if kind in ("relu", "competition", "allocation"):
        for block in m.blocks:
            block.attn = _variant(kind, dim, n_heads).eval()
    return m


def _native_against_torch(m, tokens, *, prompt, capacity):
    """A float32 model's native decoder and torch's (native=False), each fed the prompt then every later token:
    their logits agree, and with one float64 forward (the model is left in float32); returns both decoders."""
    B, N = tokens.shape
    native = StaticDecoder(m, batch=B, capacity=capacity)
    plain = StaticDecoder(m, batch=B, capacity=capacity, native=False)
    assert native.native and not plain.native
    got, expected = [native.prefill(tokens[:, :prompt])], [plain.prefill(tokens[:, :prompt])]
    for t in range(prompt, N):
        got.append(native.step(tokens[:, t]).unsqueeze(1))
        expected.append(plain.step(tokens[:, t]).unsqueeze(1))
    got, expected = torch.cat(got, 1), torch.cat(expected, 1)
    torch.testing.assert_close(got, expected, **tol(torch.float32))
    torch.testing.assert_close(got.double(), m.double()(tokens), **tol(torch.float32))
    m.float()
    return native, plain


@pytest.mark.parametrize("width", [(24, 4), (24, 3), (64, 2)], ids=["D=6", "D=8", "D=32"])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("kind", NATIVE)
def test_the_native_step_gives_the_logits_and_state_of_the_model(kind, batch, width):
    """One C call a token (float32, CPU): the logits of torch's static step and of one float64 forward, and the
    state the eager steps reach, for every mechanism and variant it runs; D = 8 and 32 take _step.c's AVX2 loops
    over the KV cache (eight keys at a time, the rest one by one: 61 keys is 7 x 8 + 5), D = 6 its plain ones."""
    m = _native_model(kind, *width)
    tokens = torch.randint(0, 256, (batch, 61))
    native, plain = _native_against_torch(m, tokens, prompt=9, capacity=64)
    held, reached = native.state(), plain.state()
    nxt = torch.randint(0, 256, (batch,))
    torch.testing.assert_close(m.step(nxt, held)[0], m.step(nxt, reached)[0], **tol(torch.float32))
    native.reset()
    torch.testing.assert_close(native.step(tokens[:, 0]), m(tokens[:, :1])[:, 0], **tol(torch.float32))


def test_the_native_step_checks_its_token_and_runs_only_what_it_can():
    m = model("linear", torch.float32)
    decoder = StaticDecoder(m, batch=2, capacity=8)
    assert decoder.native
    ids = r"StaticDecoder.step: token must hold token ids in 0..255, got values in "
    with pytest.raises(ValueError, match=ids + "3..256"):
        decoder.step(torch.tensor([3, 256]))
    with pytest.raises(ValueError, match=ids + "-1..0"):
        decoder.step(torch.tensor([-1, 0]))
    assert decoder.t == 0  # nothing was read or written
    with pytest.raises(ValueError, match=r"StaticDecoder.step: the token's batch size must be 2"):
        decoder.step(torch.tensor([1, 2, 3]))
    with pytest.raises(TypeError, match=r"StaticDecoder.step: token must be an integer tensor"):
        decoder.step(torch.tensor([1.0, 2.0]))
    # int32 ids and a strided view are taken as they come
    strided = torch.tensor([[5, 0], [7, 0]], dtype=torch.int32)[:, 0]
    torch.testing.assert_close(decoder.step(strided), m(torch.tensor([[5], [7]]))[:, 0])
    # where it cannot run, torch's operations do, or native=True says why
    normed = model("moh", torch.float32)
    for block in normed.blocks:
        block.attn = _moh(24, 4, 1, 2, qk_norm=True)
    assert StaticDecoder(model("moh", torch.float32)).native and not StaticDecoder(normed).native
    assert not StaticDecoder(model("linear", torch.float64)).native
    assert not StaticDecoder(model("linear", torch.float32), compile=True).native
    why = r"StaticDecoder: the native step must be available for native=True, got the model is float64"
    with pytest.raises(ValueError, match=why):
        StaticDecoder(model("linear", torch.float64), native=True)
    with pytest.raises(ValueError, match=r"got block 0's MoH layer normalises q, k or its heads"):
        StaticDecoder(normed, native=True)
    with pytest.raises(ValueError, match=r"StaticDecoder: native must be False with compile=True"):
        StaticDecoder(m, compile=True, native=True)


def test_without_a_compiler_the_decoder_says_why_and_keeps_torchs_operations(monkeypatch, tmp_path):
    from attnbook import _native

    monkeypatch.setenv("ATTNBOOK_NATIVE", "0")
    assert _native._build() == (None, "ATTNBOOK_NATIVE=0 is set")
    monkeypatch.delenv("ATTNBOOK_NATIVE")
    failing = tmp_path / "cc"
    failing.write_text("#!/bin/sh\necho 'cc: error: no such thing' >&2\nexit 1\n")
    failing.chmod(0o755)
    monkeypatch.setenv("CC", str(failing))
    lib, why = _native._build()
    assert lib is None and why.startswith(f"{failing} could not compile _step.c: cc: error: no such thing")
    monkeypatch.delenv("CC")

    def refuse(path):
        raise OSError(f"{path}: failed to map segment from shared object")

    monkeypatch.setattr(_native.ctypes, "CDLL", refuse)  # as from a temporary folder mounted noexec
    lib, why = _native._build()
    assert lib is None and why.startswith("the compiled _step.c could not be loaded: ") and "failed to map" in why
    monkeypatch.setenv("CC", str(failing))
    monkeypatch.setattr(_native, "_state", {})  # this process's compiled library forgotten, for the decoder
    decoder = StaticDecoder(model("linear", torch.float32))
    assert not decoder.native
    with pytest.raises(ValueError, match=r"got .*could not compile _step.c"):
        StaticDecoder(model("linear", torch.float32), native=True)
    tokens = torch.randint(0, 256, (1, 6))
    decoder.prefill(tokens[:, :5])
    torch.testing.assert_close(decoder.step(tokens[:, 5]), model("linear", torch.float32)(tokens)[:, 5])


@pytest.mark.parametrize("split", [(1, 2), (2, 1), (0, 2), (4, 0), (0, 4)], ids=lambda s: f"shared{s[0]}-routed{s[1]}")
def test_the_native_moh_step_routes_as_the_layer_does(split):
    """MoH's router in _step.c (shared heads' softmax, the top k of the routed heads renormalised, the two-stage
    weighting), for every kind of split of 4 heads (D = 8: the AVX2 loops), against torch's static step and one
    float64 forward."""
    torch.manual_seed(0)
    m = DecoderLM("moh", dim=32, n_heads=4, n_layers=2).eval()
    for block in m.blocks:
        block.attn = _moh(32, 4, *split).eval()
    _native_against_torch(m, torch.randint(0, 256, (3, 40)), prompt=5, capacity=40)
