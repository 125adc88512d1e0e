"""attnbook.lm and attnbook.lab.{corpus,lm}: the chapter 7 language model, its generation and its data."""

import math

import pytest
import torch
import torch.nn.functional as F
from support import tol

from attnbook import mechanisms
from attnbook.lab import corpus as corpus_mod
from attnbook.lab import lm as lab_lm
from attnbook.lab.progress import Progress
from attnbook.lm import DecoderLM, KVCache, LMState, sinusoidal_positions, state_bytes

CAUSAL = mechanisms.names(causal=True)
RECURRENT = [n for n in CAUSAL if mechanisms.MECHANISMS[n].step is not None]
CACHED = [n for n in CAUSAL if mechanisms.MECHANISMS[n].step is None]


def tiny(mechanism, **kw):
    return DecoderLM(mechanism, **{"dim": 16, "n_heads": 4, "n_layers": 2, **kw})


def stepwise(model, tokens):
    """Logits of every position, feeding the tokens one at a time through DecoderLM.step."""
    state, rows = None, []
    for t in range(tokens.shape[1]):
        logits, state = model.step(tokens[:, t], state)
        rows.append(logits)
    return torch.stack(rows, dim=1), state


def test_the_causal_mechanisms_and_both_decoding_forms_occur():
    assert CAUSAL == ["softmax", "linear", "flow", "moh", "decay", "gated", "delta"]
    assert RECURRENT == ["linear", "flow", "decay", "gated", "delta"] and CACHED == ["softmax", "moh"]


@pytest.mark.parametrize("mechanism", CAUSAL)
@pytest.mark.parametrize("length", [1, 7, 70], ids=lambda n: f"N{n}")
def test_step_by_step_logits_equal_the_parallel_forward_float64(mechanism, length):
    # N = 70 crosses linear attention's causal chunk (64) and the KV cache's first growth (16 rows)
    model = tiny(mechanism).double().eval()
    tokens = torch.randint(256, (2, length))
    with torch.no_grad():
        parallel = model(tokens)  # (B, N, V)
        steps, state = stepwise(model, tokens)
    assert parallel.dtype == steps.dtype == torch.float64
    torch.testing.assert_close(steps, parallel, **tol(torch.float64))
    assert isinstance(state, LMState) and state.t == length


def test_the_check_can_fail_a_step_at_the_wrong_position_differs_from_the_forward():
    model = tiny("linear").double().eval()
    tokens = torch.randint(256, (1, 5))
    with torch.no_grad():
        parallel = model(tokens)
        logits, _ = model.step(tokens[:, 0], LMState(3, model.initial_state().layers))  # position 3, not 0
    assert not torch.allclose(logits, parallel[:, 0], **tol(torch.float64))


@pytest.mark.parametrize("mechanism", CAUSAL)
def test_forward_with_a_start_offset_equals_stepping_from_that_position(mechanism):
    model = tiny(mechanism).double().eval()
    tokens = torch.randint(256, (1, 9))
    with torch.no_grad():
        # the logits of the last 4 tokens, seen after 5, depend on the first 5: compare the whole run
        full = model(tokens)
        steps, _ = stepwise(model, tokens)
        offset = model(tokens[:, :4], start=11)
        state = LMState(11, model.initial_state().layers)
        rows = []
        for t in range(4):
            logits, state = model.step(tokens[:, t], state)
            rows.append(logits)
    torch.testing.assert_close(steps, full, **tol(torch.float64))
    torch.testing.assert_close(torch.stack(rows, 1), offset, **tol(torch.float64))


@pytest.mark.parametrize("mechanism", CAUSAL)
def test_the_model_is_causal_a_later_token_never_changes_earlier_logits(mechanism):
    model = tiny(mechanism).double().eval()
    a = torch.randint(256, (1, 12))
    b = a.clone()
    b[0, 8:] = (b[0, 8:] + 1) % 256
    with torch.no_grad():
        la, lb = model(a), model(b)
    torch.testing.assert_close(la[:, :8], lb[:, :8], **tol(torch.float64))
    assert not torch.allclose(la[:, 8:], lb[:, 8:])


@pytest.mark.parametrize("mechanism", RECURRENT)
def test_recurrent_state_has_the_same_size_at_every_position(mechanism):
    model = tiny(mechanism).eval()
    sizes = []
    state = None
    with torch.no_grad():
        for t in range(300):
            _, state = model.step(torch.tensor([t % 256, 3]), state)
            if t + 1 in (1, 17, 300):
                sizes.append((state_bytes(state), state_bytes(state, allocated=True)))
    assert model.recurrent
    assert len(set(sizes)) == 1 and sizes[0][0] > 0, sizes


@pytest.mark.parametrize("mechanism", CACHED)
def test_kv_cache_holds_two_rows_of_h_d_numbers_per_token_and_layer(mechanism):
    model = tiny(mechanism).eval()
    B, L, C = 2, model.n_layers, model.dim
    state = None
    with torch.no_grad():
        for t in range(40):
            _, state = model.step(torch.tensor([t, t + 1]), state)
            assert state_bytes(state) == 2 * L * B * C * (t + 1) * 4  # keys and values, float32
            assert state_bytes(state, allocated=True) >= state_bytes(state)
    assert not model.recurrent
    assert state_bytes(state, allocated=True) == state_bytes(state)  # each token's cache is new, of exact size


def test_kv_cache_append_keeps_old_caches_valid_and_branches_copy_on_write():
    k = torch.randn(1, 2, 20, 3)
    v = torch.randn(1, 2, 20, 5)
    cache = KVCache.empty()
    history = [cache]
    for t in range(20):  # past the first capacity of 16 rows
        cache = cache.append(k[:, :, t], v[:, :, t])
        history.append(cache)
    torch.testing.assert_close(cache.keys, k, rtol=0, atol=0)
    torch.testing.assert_close(cache.values, v, rtol=0, atol=0)
    torch.testing.assert_close(history[5].keys, k[:, :, :5], rtol=0, atol=0)
    # branch from t = 5 twice: neither branch overwrites the other
    other_k, other_v = torch.randn(1, 2, 3), torch.randn(1, 2, 5)
    branch = history[5].append(other_k, other_v)
    torch.testing.assert_close(branch.keys[:, :, 5], other_k, rtol=0, atol=0)
    torch.testing.assert_close(branch.keys[:, :, :5], k[:, :, :5], rtol=0, atol=0)
    torch.testing.assert_close(history[6].keys, k[:, :, :6], rtol=0, atol=0)
    torch.testing.assert_close(cache.keys, k, rtol=0, atol=0)


def test_mobile_attention_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="Mobile-Attention has no causal form"):
        DecoderLM("mobile")


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"mechanism": "rnn"}, ValueError, "mechanism must be one of"),
        ({"mechanism": "softmax", "dim": 10, "n_heads": 4}, ValueError, "dim must be a multiple of n_heads"),
        ({"mechanism": "softmax", "n_layers": 0}, ValueError, "n_layers must be an int >= 1"),
        ({"mechanism": "softmax", "vocab": 2.5}, TypeError, "vocab must be an int"),
    ],
    ids=["unknown-mechanism", "indivisible-heads", "no-layers", "float-vocab"],
)
def test_bad_construction_arguments_raise_naming_them(kwargs, error, match):
    with pytest.raises(error, match=match):
        DecoderLM(**kwargs)


def test_bad_tokens_and_states_raise_naming_them():
    model = tiny("softmax")
    for dtype in (torch.float32, torch.int8, torch.int16, torch.uint8, torch.bool):  # int8 failed in the embedding
        with pytest.raises(TypeError, match="tokens must be an int64 or int32 tensor of token ids"):
            model(torch.ones(1, 4, dtype=dtype))
    assert model(torch.ones(1, 4, dtype=torch.int32)).shape == model(torch.ones(1, 4, dtype=torch.int64)).shape
    with pytest.raises(ValueError, match=r"token ids in 0\.\.255, got values in 0\.\.300"):
        model(torch.tensor([[0, 300]]))
    with pytest.raises(ValueError, match=r"\(B, N\)"):
        model(torch.tensor([1, 2]))
    with pytest.raises(ValueError, match=r"start must be an int in 0\.\.4611686018427387904, got -1"):
        model(torch.tensor([[1, 2]]), start=-1)
    with pytest.raises(ValueError, match="^DecoderLM.step: state.layers must hold 2 layers, got 0 layers$"):
        model.step(torch.tensor([1]), LMState(0, ()))
    with pytest.raises(TypeError, match="^DecoderLM.step: state must be an LMState with 2 layers or None, got 0$"):
        model.step(torch.tensor([1]), 0)
    _, state = model(torch.tensor([[1, 2]]), output_final_state=True)
    for bad, error, message in (  # a ValueError from torch.tensor, and "object of type 'int' has no len()"
        (state._replace(t="a"), TypeError, r"^DecoderLM.step: state.t must be an int, got 'a'$"),
        (state._replace(t=-1), ValueError, r"^DecoderLM.step: state.t must be an int in 0\.\."),
        (state._replace(layers=5), TypeError, r"^DecoderLM.step: state.layers must be a tuple of 2 layer states"),
    ):
        with pytest.raises(error, match=message):
            model.step(torch.tensor([1]), bad)
    with pytest.raises(ValueError, match="temperature must be"):
        model.generate(torch.tensor([[1]]), 3, temperature=-1.0)
    for seed in (2**64, -(2**63) - 1):  # torch's "Overflow when unpacking long long"
        with pytest.raises(ValueError, match=r"seed must be an int in -9223372036854775808\.\.18446744073709551615"):
            model.generate(torch.tensor([[1]]), 3, seed=seed)
    with pytest.raises(ValueError, match=r"start must be an int in 0\.\.4611686018427387904"):  # an OverflowError
        model(torch.tensor([[1, 2]]), start=10**30)


@pytest.mark.parametrize("mechanism", CAUSAL)
def test_greedy_generation_picks_the_argmax_of_the_forward_at_every_step(mechanism):
    model = tiny(mechanism).eval()
    prompt = torch.tensor([[10, 20, 30]])
    out = model.generate(prompt, 6, temperature=0)
    assert out.shape == (1, 9) and torch.equal(out[:, :3], prompt)
    with torch.no_grad():
        logits = model(out[:, :-1])  # (1, 8, V)
    torch.testing.assert_close(logits[0, 2:].argmax(-1), out[0, 3:], rtol=0, atol=0)


def test_sampling_is_reproducible_by_seed_and_restores_the_training_mode():
    model = tiny("flow")
    model.train()
    prompt = torch.tensor([[1, 2], [3, 4]])
    a = model.generate(prompt, 20, seed=3)
    b = model.generate(prompt, 20, seed=3)
    c = model.generate(prompt, 20, seed=4)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert model.training
    top1 = model.generate(prompt, 5, top_k=1, seed=9)
    assert torch.equal(top1, model.generate(prompt, 5, temperature=0))


@pytest.mark.parametrize("temperature", [1e-40, 1e-30, 1e-8])
def test_a_tiny_temperature_samples_the_likeliest_token(temperature):
    """logits / 1e-40 overflowed to inf, softmax gave NaN and torch.multinomial raised; the largest logit is
    subtracted first, so a tiny temperature is greedy decoding (up to exact ties)."""
    model = tiny("softmax").eval()
    prompt = torch.tensor([[10, 20, 30], [5, 6, 7]])
    out = model.generate(prompt, 6, temperature=temperature, seed=0)
    assert torch.equal(out, model.generate(prompt, 6, temperature=0))


def test_sinusoidal_positions_follow_the_formula_for_every_width_and_position():
    p = sinusoidal_positions(torch.tensor([0, 1, 5000]), 7, torch.float64)
    assert p.shape == (3, 7)
    torch.testing.assert_close(p[0], torch.tensor([0.0, 1, 0, 1, 0, 1, 0], dtype=torch.float64))
    for i in range(7):
        freq = 10000 ** (-(i - i % 2) / 7)
        want = math.sin(5000 * freq) if i % 2 == 0 else math.cos(5000 * freq)
        assert p[2, i].item() == pytest.approx(want, rel=1e-12, abs=1e-12)


def test_the_model_runs_in_bfloat16_and_returns_that_dtype():
    model = tiny("flow").to(torch.bfloat16)
    logits = model(torch.randint(256, (2, 9)))
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits).all()


def test_a_model_with_zero_embeddings_is_the_uniform_guess_eight_bits_per_byte():
    model = tiny("softmax")
    with torch.no_grad():
        model.embed.weight.zero_()  # the tied head then gives every byte logit 0
    data = torch.randint(256, (500,), dtype=torch.uint8)
    bpb = lab_lm.bits_per_byte(model, data, lab_lm.validation_starts(data, 4, 32), 32)
    assert bpb == pytest.approx(8.0, abs=1e-5)


# --- the corpus -------------------------------------------------------------------------------------------


def test_the_stdlib_split_is_deterministic_disjoint_and_decided_by_file_name():
    a, b = corpus_mod.load_stdlib(), corpus_mod.load_stdlib()
    assert a.train_files == b.train_files and a.valid_files == b.valid_files
    assert torch.equal(a.train, b.train) and torch.equal(a.valid, b.valid)
    assert not set(a.train_files) & set(a.valid_files)
    assert list(a.train_files) == sorted(a.train_files) and len(a.valid_files) >= 1
    assert all(corpus_mod.is_validation(n) for n in a.valid_files)
    assert not any(corpus_mod.is_validation(n) for n in a.train_files)
    assert a.train.dtype == torch.uint8 and a.train.numel() > 10 * a.valid.numel() / 2
    assert "files from" in a.describe()


def test_a_file_keeps_its_split_when_other_files_come_and_go(tmp_path):
    names = [f"m{i}.py" for i in range(40)]
    for n in names:
        (tmp_path / n).write_text(f"# {n}\n")
    full = corpus_mod.load_stdlib(tmp_path)
    (tmp_path / names[0]).unlink()
    (tmp_path / "zzz_new.py").write_text("x = 1\n")
    changed = corpus_mod.load_stdlib(tmp_path)
    for n in names[1:]:
        assert (n in full.valid_files) == (n in changed.valid_files)
    assert full.train.numel() == sum(len(f"# {n}\n") for n in full.train_files)


def test_a_folder_without_sources_or_without_a_split_raises(tmp_path):
    with pytest.raises(
        ValueError,
        match=r"^stdlib_files: root must hold \*\.py files \(is the standard library zipped\?\), got none in",
    ):
        corpus_mod.load_stdlib(tmp_path)
    name = next(f"f{i}.py" for i in range(100) if not corpus_mod.is_validation(f"f{i}.py"))
    (tmp_path / name).write_text("pass\n")
    with pytest.raises(
        ValueError,
        match=r"^load_stdlib: the validation split must hold at least 1 file \(of the 1 files in .*\), got 0 files$",
    ):
        corpus_mod.load_stdlib(tmp_path)


def test_windows_give_inputs_and_the_next_byte_as_target():
    data = torch.arange(50, dtype=torch.uint8)
    x, y = corpus_mod.windows(data, torch.tensor([0, 10]), 8)
    assert x.shape == y.shape == (2, 8) and x.dtype == torch.int64
    assert torch.equal(x[1], torch.arange(10, 18)) and torch.equal(y[1], torch.arange(11, 19))
    with pytest.raises(ValueError, match=r"^windows: data must hold at least 51 bytes \(length \+ 1\), got 50 bytes$"):
        corpus_mod.windows(data, torch.tensor([0]), 50)


def test_validation_starts_and_distinct_fraction_refuse_too_little_data():
    data = torch.arange(10, dtype=torch.uint8)
    assert lab_lm.validation_starts(data, 2, 9).tolist() == [0, 0]
    with pytest.raises(
        ValueError, match=r"^validation_starts: data must hold at least 11 bytes \(length \+ 1\), got 10"
    ):
        lab_lm.validation_starts(data, 2, 10)
    assert lab_lm.distinct_fraction(b"abab", 2) == 2 / 3
    with pytest.raises(ValueError, match=r"^distinct_fraction: data must hold at least 4 bytes \(n\), got 3 bytes$"):
        lab_lm.distinct_fraction(b"abc", 4)
    with pytest.raises(TypeError, match="^distinct_fraction: data must be bytes, got 'abc'$"):
        lab_lm.distinct_fraction("abc")


def test_race_needs_a_mechanism_and_a_seed(stdlib):
    with pytest.raises(ValueError, match="^race: mechanism_names must hold at least 1 mechanism, got 0 mechanisms$"):
        lab_lm.race([], stdlib, seeds=(0,), progress=False)
    with pytest.raises(ValueError, match="^race: seeds must hold at least 1 seed, got 0 seeds$"):
        lab_lm.race(["softmax"], stdlib, seeds=(), progress=False)


# --- training ---------------------------------------------------------------------------------------------


def test_the_learning_rate_warms_up_then_decays_to_a_tenth():
    s = lab_lm.Setup(steps=100, warmup=10, lr=1e-2)
    lrs = [lab_lm.learning_rate(i, s) for i in range(100)]
    assert lrs[9] == pytest.approx(1e-2) and lrs[0] == pytest.approx(1e-3)
    assert all(a < b for a, b in zip(lrs[:9], lrs[1:10], strict=True))
    assert all(a >= b for a, b in zip(lrs[10:-1], lrs[11:], strict=True))
    assert lab_lm.learning_rate(100, s) == pytest.approx(1e-3)


def test_ngram_baselines_know_a_periodic_text():
    text = torch.tensor(list(b"ab" * 50_000), dtype=torch.uint8)  # add-one smoothing fades
    assert lab_lm.ngram_bits_per_byte(text, text, 1) == pytest.approx(1.0, abs=0.02)  # two equally likely bytes
    assert lab_lm.ngram_bits_per_byte(text, text, 2) < 0.01  # the next byte is determined by the last


SMALL = lab_lm.Setup(dim=32, n_heads=4, n_layers=1, context=32, batch=8, steps=40, lr=2e-2, warmup=5,
                     eval_every=20, eval_windows=8)  # fmt: skip


@pytest.fixture(scope="module")
def stdlib():
    return corpus_mod.load_stdlib()


@pytest.mark.parametrize("mechanism", CAUSAL)
def test_every_mechanism_learns_well_below_the_uniform_eight_bits_per_byte(mechanism, stdlib):
    run = lab_lm.train(mechanism, stdlib, SMALL, seed=0)
    assert run.steps == [0, 20, 40] and len(run.train_bpb) == 40
    assert run.valid_bpb[0] > 7.0  # an untrained model is close to the uniform guess
    assert run.final_bpb < 5.5, run.valid_bpb
    assert run.wall_s[-1] > 0 and not run.model.training


def test_one_seed_gives_every_mechanism_the_same_windows_and_runs_are_reproducible(stdlib):
    a = lab_lm.train("linear", stdlib, SMALL, seed=1)
    b = lab_lm.train("linear", stdlib, SMALL, seed=1)
    assert a.valid_bpb == b.valid_bpb and a.train_bpb == b.train_bpb
    runs = lab_lm.race(["softmax", "linear"], stdlib, lab_lm.Setup(**{**SMALL.__dict__, "steps": 2}),
                       seeds=(0, 1), progress=False)  # fmt: skip
    assert [r.seed for r in runs["linear"]] == [0, 1]
    assert runs["softmax"][0].valid_bpb[0] != runs["softmax"][1].valid_bpb[0]  # a seed changes the weights


def test_spread_is_mean_and_sample_standard_deviation():
    assert lab_lm.spread([1.0, 2.0, 3.0]) == (2.0, 1.0)
    assert lab_lm.spread([4.0]) == (4.0, 0.0)


def test_the_progress_line_draws_on_a_terminal_and_can_be_silenced(capsys):
    bar = Progress(4, interval=0.0)
    for _ in range(4):
        bar.update(note="flow")
    bar.close()
    err = capsys.readouterr().err
    assert "\r[" in err and "100%  4/4" in err and err.endswith("flow\n")
    quiet = Progress(4, enabled=False)
    quiet.update()
    quiet.close()
    assert capsys.readouterr().err == ""
    with pytest.raises(ValueError, match="total must be an int >= 1"):
        Progress(0)


def test_the_training_loss_is_the_cross_entropy_in_bits(stdlib):
    run = lab_lm.train("softmax", stdlib, lab_lm.Setup(**{**SMALL.__dict__, "steps": 1}), seed=0)
    torch.manual_seed(0)
    model = SMALL.model("softmax")
    x, y = corpus_mod.windows(stdlib.train, torch.randint(0, stdlib.train.numel() - 33, (8,),
                              generator=torch.Generator().manual_seed(0)), 32)  # fmt: skip
    loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten()).item()
    assert run.train_bpb[0] == pytest.approx(loss / math.log(2), rel=1e-5)


def test_one_training_step_per_mechanism_is_timed_alternately(stdlib):
    times = lab_lm.step_seconds(["softmax", "flow"], stdlib, lab_lm.Setup(**{**SMALL.__dict__, "batch": 2}), repeats=2)
    assert set(times) == {"softmax", "flow"}
    assert all(0 < t["min"] <= t["median"] for t in times.values())


# --- chapter 7's tables --------------------------------------------------------------------------------------


def test_as_text_decodes_wraps_and_marks_unprintable_bytes():
    assert corpus_mod.as_text(b"def f():\n\treturn 1") == "def f():\n    return 1"
    assert corpus_mod.as_text(b"a\x01b") == "a·b"
    assert corpus_mod.as_text(b"x" * 10, width=4) == "xxxx\nxxxx\nxx"
    assert corpus_mod.as_text(torch.tensor([[104, 105]])) == "hi"  # a generated (1, N) sequence
    assert corpus_mod.as_text(b"\xff") == "\ufffd"  # invalid UTF-8 is replaced, not an error
    with pytest.raises(TypeError, match="^as_text: data must be bytes or a tensor of byte values, got 'abc'$"):
        corpus_mod.as_text("abc")


def _recorded_runs():
    runs = []
    for name, base in (("softmax", 3.0), ("linear", 3.2)):
        for seed, shift in enumerate((0.0, 0.1, 0.2)):
            runs.append({"mechanism": name, "seed": seed, "steps": [0, 10], "wall_s": [0.0, 10.0 + seed],
                         "valid_bpb": [8.0, base + shift]})  # fmt: skip
    return runs


def test_final_bpb_and_its_table_read_live_runs_and_recorded_dicts_alike():
    recorded = _recorded_runs()
    final = lab_lm.final_bpb(recorded)
    assert list(final) == ["softmax", "linear"]
    assert final["softmax"] == pytest.approx([3.0, 3.1, 3.2]) and final["linear"] == pytest.approx([3.2, 3.3, 3.4])
    live = {n: [lab_lm.Run(n, r["seed"], r["steps"], r["wall_s"], r["valid_bpb"]) for r in recorded
                if r["mechanism"] == n] for n in final}  # fmt: skip
    assert lab_lm.final_bpb(live) == final
    table = lab_lm.bpb_table(recorded).splitlines()
    assert table[1].split() == ["softmax", "3.100", "±", "0.100", "11.0"]
    assert lab_lm.bpb_table(live) == lab_lm.bpb_table(recorded)


def test_recording_header_names_the_machine_its_load_and_the_budget():
    recording = {
        "environment": {"device_name": "CPU X", "device": "cpu", "threads": 1, "date_utc": "2026-12-03T10:00:00",
                        "load_average_before": [0.25, 0, 0], "load_average_after": [0.75, 0, 0]},
        "setup": {"dim": 16, "n_heads": 4, "n_layers": 2, "context": 32, "batch": 4, "steps": 10},
        "runs": _recorded_runs(),
    }  # fmt: skip
    first, second, third = lab_lm.recording_header(recording).splitlines()
    assert first == "CPU X (cpu, 1 thread), 2026-12-03, load 0.2 -> 0.8;"
    n_params = sum(p.numel() for p in tiny("flow").parameters())
    assert second == f"width 16, 2 blocks, {n_params:,d} parameters;"
    assert third == "32-byte windows, batch 4, 10 steps, 3 seeds"


def test_quality_cost_table_puts_quality_training_speed_and_writing_in_one_row():
    from attnbook.lab import generation

    writing = generation.measure(lab_lm.Setup(dim=8, n_heads=2, n_layers=1), mechanism_names=["softmax", "linear"],
                                 positions=[4, 16], repeats=1, warmup=0, progress=False)  # fmt: skip
    speed = {"steps": {"softmax eager": {"tokens_per_s": 1234.4}, "linear eager": {"tokens_per_s": 99.0},
                       "nanogpt eager": {"tokens_per_s": 2000.0}}}  # fmt: skip
    table = lab_lm.quality_cost_table({"runs": _recorded_runs()}, writing, speed, early=4).splitlines()
    assert table[1].split() == ["mean", "±", "sd", "tokens/s", "t=4", "t=16", "KiB"]  # sd over the seeds
    softmax = table[2].split()
    assert softmax[:5] == ["softmax", "3.100", "±", "0.10", "1,234"]
    assert float(softmax[-1]) == round(2 * 1 * 8 * 16 * 4 / 1024)  # the cache after 16 tokens, KiB
    assert table[-1] == "nanoGPT-style SDPA model of the same size: 2,000 tokens/s"
    bare = lab_lm.quality_cost_table({"runs": _recorded_runs()}, writing, early=4).splitlines()
    assert bare[2].split()[4] == "-" and len(bare) == 4
