"""attnbook.lab.claims: the tasks are what they say, variants reach the modules, the studies run end to end."""

import dataclasses
import json
import math

import pytest
import torch
from torch import nn

import attnbook
from attnbook.lab import claims, listops
from attnbook.lab.claims import Setup, Variant

TINY = Setup(d_model=8, n_heads=2, n_layers=1, batch=8, steps=3, warmup=1, eval_every=2, eval_size=16)
LISTOPS = claims.ListOpsTask(listops.ListOps(max_depth=2, max_args=3, min_length=4, max_length=16))
PAIRS = claims.MultiKeyRecallTask(n_pairs=4, n_keys=6, n_values=5, n_queried=2)
ABLATIONS = ("flow_no_competition", "flow_no_allocation")


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models train in one thread: on a shared 2-core machine two threads wait on each other (7x slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("n_queried", [1, 2, 3])
def test_multi_key_recall_targets_are_the_named_values_in_order(n_queried):
    task = claims.MultiKeyRecallTask(n_pairs=4, n_keys=6, n_values=3, n_queried=n_queried)
    b = task.batch(300, torch.Generator().manual_seed(0))
    assert b.tokens.shape == (300, task.length) and b.padding is None
    key, value, asked, is_query = task.fields(b.tokens)
    assert is_query[:, -1].all() and not is_query[:, :-1].any()
    for i in range(300):
        keys = key[i, :-1].tolist()
        assert len(set(keys)) == task.n_pairs
        named = asked[i, -1].tolist()
        assert len(set(named)) == n_queried and set(named) <= set(keys) and named[0] == key[i, -1]
        digits = [value[i, keys.index(k)].item() for k in named]
        assert b.target[i].item() == sum(d * 3 ** (n_queried - 1 - j) for j, d in enumerate(digits))
    assert set(b.target.tolist()) == set(range(task.n_classes)) and task.n_classes == 3**n_queried
    assert b.tokens.max() < task.vocab and task.chance == 1 / 3**n_queried


def test_variant_options_reach_the_module():
    relu = Variant("linear_relu", "linear", (("feature_map", "relu"),))
    assert claims.available(relu)
    torch.manual_seed(0)
    a = claims.VARIANTS["linear"].build(8, 2)
    torch.manual_seed(0)
    b = relu.build(8, 2)
    x = torch.randn(2, 5, 8)
    assert not torch.allclose(a(x), b(x))  # same weights, another feature map
    assert not claims.available(Variant("bad", "flow", (("no_such_argument", 1),)))
    assert all(claims.available(name) for name in ("softmax", "linear", "flow", "mobile", "moh"))


@pytest.mark.parametrize("name", ABLATIONS)
def test_the_flow_ablations_change_flow_attention(name):
    if not claims.available(name):
        pytest.skip(f"the installed FlowAttention does not take {dict(claims.VARIANTS[name].options)} yet")
    torch.manual_seed(0)
    full = claims.VARIANTS["flow"].build(8, 2)
    torch.manual_seed(0)
    ablated = claims.VARIANTS[name].build(8, 2)
    assert all(torch.equal(p, r) for p, r in zip(full.parameters(), ablated.parameters(), strict=True))
    x = torch.randn(2, 7, 8)
    assert (full(x) - ablated(x)).abs().max() > 1e-4


@pytest.mark.parametrize("name", ABLATIONS)
def test_each_ablation_replaces_exactly_its_factor_by_one(name):
    if not claims.available(name):
        pytest.skip(f"the installed FlowAttention does not take {dict(claims.VARIANTS[name].options)} yet")
    import attnbook

    q, k, v = (torch.randn(2, 2, 7, 4, dtype=torch.float64) for _ in range(3))
    _, stats = attnbook.flow_attention(q, k, v, return_flows=True)  # a_i, c_j and I_i of the full mechanism
    a, c = stats.allocation, stats.competition
    if name == "flow_no_competition":
        c = torch.ones_like(c)
    else:
        a = torch.ones_like(a)
    kv = torch.sigmoid(k).transpose(-2, -1) @ (c.unsqueeze(-1) * v)  # (B, H, D, Dv)
    expected = (a / stats.incoming).unsqueeze(-1) * (torch.sigmoid(q) @ kv)  # (B, H, N, Dv)
    options = dict(claims.VARIANTS[name].options)
    torch.testing.assert_close(attnbook.flow_attention(q, k, v, **options), expected, rtol=1e-10, atol=1e-12)


def test_unavailable_variants_are_skipped_and_named_or_refused():
    bad = Variant("bad", "flow", (("no_such_argument", 1),))
    result = claims.compare(LISTOPS, TINY, variants=["softmax", bad], seeds=1)
    assert result.skipped == ["bad"] and result.variants == ["softmax"]
    with pytest.raises(TypeError, match="unexpected keyword argument 'no_such_argument'"):
        claims.compare(LISTOPS, TINY, variants=[bad], seeds=1, skip_unavailable=False)


def test_mean_pooling_reads_the_real_tokens_only():
    model = claims.Classifier("softmax", vocab=16, length=10, n_classes=10, d_model=8, n_heads=2, n_layers=1)
    model.blocks = nn.ModuleList()  # the readout alone: head(norm(embedding)) pooled
    tokens = torch.tensor([[10, 1, 2, 14, 15, 15], [11, 3, 4, 5, 14, 15]])
    padding = tokens == listops.PAD
    base = model(tokens, padding)
    other_pads = tokens.masked_fill(padding, 3)  # different ids where the mask says padding
    torch.testing.assert_close(model(other_pads, padding), base)
    changed = tokens.clone()
    changed[0, 1] = 9  # a real token
    assert not torch.allclose(model(changed, padding)[0], base[0])
    torch.testing.assert_close(model(changed, padding)[1], base[1])


@pytest.mark.parametrize("name", ["softmax", "linear", "flow", "mobile", "moh"])
def test_training_runs_end_to_end_for_every_mechanism(name):
    run = claims.train(name, LISTOPS, TINY, seed=1)
    assert run.steps == [0, 2, 3] and len(run.accuracy) == len(run.loss) == 3
    assert all(0.0 <= a <= 1.0 for a in run.accuracy) and all(math.isfinite(x) for x in run.loss)
    assert run.wall_s[0] == 0.0 and run.wall_s[-1] > 0.0
    assert 0.1 <= run.majority <= 1.0


def test_a_seed_reproduces_a_run_and_every_variant_sees_the_same_held_out_set():
    a = claims.train("linear", LISTOPS, TINY, seed=3)
    b = claims.train("linear", LISTOPS, TINY, seed=3)
    assert a.accuracy == b.accuracy and a.loss == b.loss
    assert claims.train("softmax", LISTOPS, TINY, seed=3).majority == a.majority


def test_training_learns_an_easy_task():
    task = claims.MultiKeyRecallTask(n_pairs=2, n_keys=3, n_values=2, n_queried=2)  # 4 classes
    setup = Setup(d_model=32, n_heads=4, n_layers=1, batch=64, steps=150, lr=1e-2, warmup=10, eval_every=150)
    run = claims.train("softmax", task, setup, seed=0)
    assert run.loss[-1] < 0.5 * run.loss[0]
    assert run.final_accuracy > 0.8  # chance 1/4
    assert run.steps_to(0.8) is not None and run.steps_to(1.1) is None


def test_compare_alternates_every_variant_over_the_seeds_and_summarises_them():
    result = claims.compare(LISTOPS, TINY, variants=["softmax", "flow"], seeds=[4, 5])
    assert result.variants == ["softmax", "flow"]
    assert [r.seed for r in result.runs["flow"]] == [4, 5]
    s = result.summary("flow")
    finals = [r.final_accuracy for r in result.runs["flow"]]
    assert s.seeds == 2 and s.low == min(finals) and s.high == max(finals)
    assert s.mean == pytest.approx(sum(finals) / 2)
    assert result.chance == 0.1 and 0.1 <= result.majority <= 1.0
    record = json.loads(json.dumps(result.to_dict()))
    assert record["summary"]["flow"]["spread"] == pytest.approx(s.high - s.low)
    assert len(record["runs"]) == 4 and record["task"]["max_depth"] == 2


def test_effective_rank_counts_the_directions_a_head_output_spans():
    one = torch.randn(20, 1) @ torch.randn(1, 4)  # (N, D) of rank 1
    assert claims.effective_rank(one.double()).item() == pytest.approx(1.0, abs=1e-6)
    q, _ = torch.linalg.qr(torch.randn(20, 4, dtype=torch.float64))
    spread = q - q.mean(0)  # centred: four directions of similar size
    assert 3.0 < claims.effective_rank(spread).item() <= 4.0
    assert claims.effective_rank(torch.ones(5, 3, dtype=torch.float64)).item() == 0.0  # no spread at all
    same = torch.randn(1, 3, dtype=torch.float64).expand(5, 3) * (1 + 1e-15 * torch.randn(5, 1, dtype=torch.float64))
    assert claims.effective_rank(same).item() == 0.0  # rounding is no direction


def test_the_relative_spread_is_the_varying_share_of_a_head_output_whatever_its_size():
    x = torch.randn(2, 30, 4, dtype=torch.float64)
    zero_mean = x - x.mean(-2, keepdim=True)
    torch.testing.assert_close(claims._relative_spread(zero_mean), torch.ones(2, dtype=torch.float64))
    assert claims._relative_spread(torch.ones(30, 4) * 3).item() == 0.0
    shifted = zero_mean + 3.0  # a constant part three times the varying part's rms per channel
    torch.testing.assert_close(claims._relative_spread(shifted), claims._relative_spread(100 * shifted))
    expected = (zero_mean.pow(2).mean(-2).sum(-1) / shifted.pow(2).mean(-2).sum(-1)).sqrt()
    torch.testing.assert_close(claims._relative_spread(shifted), expected)


def test_a_head_that_averages_uniformly_has_no_spread():
    model = claims.Classifier("linear", vocab=16, length=8, n_classes=4, d_model=8, n_heads=2, n_layers=1)
    attn = model.blocks[0].attn
    with torch.no_grad():  # zero queries and keys: every query weighs every key alike
        for p in (attn.query_projection, attn.key_projection):
            p.weight.zero_()
            p.bias.zero_()
    tokens = torch.randint(15, (6, 8))
    stats = claims.head_stats(model, tokens)
    assert len(stats.spread) == 2 and stats.head_dim == 4
    assert max(stats.spread) < 1e-6 and max(stats.rank) == 0.0
    assert all(2.0 < r <= 4.0 for r in stats.value_rank) and min(stats.value_spread) > 0.3
    fresh = claims.head_stats(
        claims.Classifier("softmax", vocab=16, length=8, n_classes=4, d_model=8, n_heads=2), tokens
    )
    assert min(fresh.spread) > 0.01 and all(0 < r <= 4.0 for r in fresh.rank)


def test_the_head_width_study_keeps_the_total_width_and_measures_every_head():
    task = claims.HEADS_TASK.__class__(n_pairs=3, n_keys=4, n_values=3)
    setup = dataclasses.replace(TINY, d_model=8)
    study = claims.head_width_study(task, setup, widths=(2, 4), seeds=1, probe_size=8)
    assert study.variants == list(claims.HEADS_VARIANTS) and study.widths == [2, 4]
    assert study.variants == ["linear", "linear_sigmoid", "flow", "mobile"]  # the controls beside Mobile
    for v in study.variants:
        for d in (2, 4):
            (initial,), (trained,) = study.initial[v][d], study.trained[v][d]
            assert initial.head_dim == trained.head_dim == d and len(trained.spread) == 8 // d
            assert all(0 <= r <= d + 1e-9 for r in trained.rank)
            assert study.runs[v][d][0].steps[-1] == 3
    assert initial.spread != trained.spread  # measured before and after training
    json.dumps(study.to_dict())
    with pytest.raises(ValueError, match="setup.d_model must be a multiple of every head width, got setup.d_model=8"):
        claims.head_width_study(task, setup, widths=(3,), seeds=1)


def test_fewer_heads_is_plain_attention_with_that_many_heads_of_the_studys_width():
    layer = claims.mha_variant(2).build(16, 4)  # 2 of 4 heads of width 4
    assert isinstance(layer, attnbook.SoftmaxAttention) and layer.n_heads == 2 and layer.d_model == 8
    model = claims.Classifier(claims.mha_variant(3), vocab=16, length=8, n_classes=4, d_model=12, n_heads=4)
    assert all(b.attn.n_heads == 3 for b in model.blocks)
    assert model(torch.randint(16, (2, 8))).shape == (2, 4)


def test_the_no_attention_baseline_sees_each_token_alone():
    model = claims.Classifier("none", vocab=16, length=8, n_classes=4, d_model=8, n_heads=2, pool="last").eval()
    tokens = torch.randint(16, (2, 8))
    changed = tokens.clone()
    changed[:, :7] = (tokens[:, :7] + 1) % 16  # every token but the last one read out
    torch.testing.assert_close(model(changed), model(tokens))  # the last position sees only itself
    assert "none" in claims.LISTOPS_VARIANTS


def test_the_moh_study_activates_the_fraction_of_heads_it_reports():
    setup = dataclasses.replace(TINY, d_model=16, n_heads=4)
    study = claims.moh_study(PAIRS, setup, splits=((1, 1), (4, 0)), seeds=1)
    assert [f for f, _ in study.curve()] == [0.5, 1.0]
    assert study.comparison.variants == ["moh_s1_k1", "moh_s4_k0", "softmax"]
    layer = claims.moh_variant(1, 1).build(16, 4)
    _, routing = layer(torch.randn(2, 5, 16), return_routing=True)
    assert (routing.selected.sum(-1) == 2).all()  # 2 of 4 heads per token
    record = json.loads(json.dumps(study.to_dict()))
    assert [row["fraction"] for row in record["curve"]] == [0.5, 1.0] and record["softmax"]["fraction"] == 1.0
    assert len(study.final_loss("softmax")) == 1 and len(study.steps_to("moh_s1_k1")) == 1
    with pytest.raises(ValueError, match="MoHAttention: each token would use shared_head"):
        claims.moh_study(PAIRS, setup, splits=((2, 3),), seeds=1)


def test_rescaling_keeps_the_toy_flat_and_trained_projections_concentrate_it():
    demo = claims.lookup_share_demo(6, 8, steps=100, scales=(1, 16, 128))
    for m in ("linear", "flow"):
        assert max(demo.rescaled[m]) < 0.4  # 6 keys: uniform 0.17
        assert demo.trained[m] > max(demo.rescaled[m]) + 0.15
        assert demo.overlap_trained[m] < demo.overlap_rescaled[m]
    assert demo.uniform == pytest.approx(1 / 6)
    json.dumps(demo.to_dict())


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match=r"^Setup: d_model must be a multiple of n_heads, got d_model=30, n_heads=4$"):
        Setup(d_model=30, n_heads=4)
    with pytest.raises(ValueError, match=r"^train: variant must be one of 'softmax', 'linear'"):
        claims.train("rnn", LISTOPS, TINY)
    with pytest.raises(ValueError, match=r"^Classifier: pool must be one of 'mean', 'last', 'all', got 'max'$"):
        claims.Classifier("flow", vocab=4, length=4, n_classes=2, pool="max")
    with pytest.raises(ValueError, match=r"^MultiKeyRecallTask: n_pairs must be an int >= 3 \(n_queried: the query"):
        claims.MultiKeyRecallTask(n_pairs=2, n_queried=3)
    with pytest.raises(TypeError, match=r"^train: task must be a ListOpsTask \(or ListOps\), a MultiKeyRecallTask or"):
        claims.train("flow", "listops", TINY)
    with pytest.raises(ValueError, match=r"^lookup_share_demo: names must be one of 'linear', 'flow', 'mobile'"):
        claims.lookup_share_demo(names=("softmax",))


def _bench_claims():
    import importlib.util
    import pathlib
    import sys

    folder = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"
    if str(folder) not in sys.path:  # the scripts import benchmarks/recording.py, as when run from there
        sys.path.insert(0, str(folder))
    spec = importlib.util.spec_from_file_location("bench_claims", folder / "bench_claims.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_recording_writes_seeds_configuration_results_and_the_load(monkeypatch, tmp_path):
    bench_claims = _bench_claims()
    import recording

    monkeypatch.setattr(recording.os, "getloadavg", lambda: (0.25, 0.5, 0.5))
    argv = ["bench_claims.py", "--study", "lookup", "--size", "small", "--seeds", "0", "--out-dir", str(tmp_path)]
    monkeypatch.setattr(bench_claims.sys, "argv", argv)
    threads = torch.get_num_threads()
    bench_claims.main()
    torch.set_num_threads(threads)
    record = json.loads((tmp_path / "lookup_cpu_small.json").read_text())
    env = record["environment"]
    assert env["load_average_before"] == env["load_average_after"] == [0.25, 0.5, 0.5] and env["forced"] is False
    assert env["threads"] == 1 and env["torch"] == torch.__version__
    assert record["seeds"] == [0] and record["size"] == "small" and record["wall_seconds"] > 0
    assert [(d["n_tokens"], d["dim"]) for d in record["demos"]] == [(24, 16), (6, 8)]
    assert all(d["steps"] == 100 for d in record["demos"])


# ---------------------------------------------------------------------------------------------- what the chapters print


def _tiny_comparison(variants=("softmax", "linear"), seeds=2):
    spec = listops.ListOps(max_depth=1, max_args=3, min_length=4, max_length=8)
    setup = Setup(d_model=8, n_heads=2, n_layers=1, batch=4, steps=2, lr=1e-3, warmup=1, eval_every=1, eval_size=8)
    return claims.compare(claims.ListOpsTask(spec), setup, variants=list(variants), seeds=seeds)


def test_the_paper_numbers_are_flowformers_table():
    paper = claims.FLOWFORMER_PAPER
    assert paper["ListOps"] == {"softmax": 36.37, "linear": 16.13, "flow": 38.70}
    assert paper["Retrieval"] == {"linear": 53.09, "flow": 62.24}
    assert paper["LRA average"] == {"flow": 56.48, "flow_no_competition": 55.25, "flow_no_allocation": 55.58}


def test_effective_rank_public_counts_directions_and_batches():
    line = torch.tensor([[0.0, 0.0], [1.0, 2.0], [2.0, 4.0]])
    assert claims.effective_rank(line).item() == pytest.approx(1.0, abs=1e-6)
    assert claims.effective_rank(torch.eye(3)).item() == pytest.approx(2.0, abs=1e-6)
    batch = torch.stack([line, line * 3])  # (2, N, D): one rank per matrix, scale-free
    ranks = claims.effective_rank(batch)
    assert ranks.shape == (2,) and ranks.dtype == torch.float64
    torch.testing.assert_close(ranks, torch.ones(2, dtype=torch.float64), atol=1e-6, rtol=0)
    assert claims.effective_rank(torch.ones(4, 3)).item() == 0.0
    with pytest.raises(ValueError, match="effective_rank"):
        claims.effective_rank(torch.ones(3))


def test_accuracy_spans_read_a_live_comparison_and_a_recording_alike():
    live = _tiny_comparison()
    spans = claims.accuracy_spans(live)
    assert list(spans) == ["softmax", "linear"]
    for name, (mean, low, high) in spans.items():
        final = [run.final_accuracy for run in live.runs[name]]
        assert low == pytest.approx(min(final)) and high == pytest.approx(max(final))
        assert mean == pytest.approx(sum(final) / len(final))
    recorded = json.loads(json.dumps(live.to_dict()))  # what the recording stores
    back = claims.accuracy_spans(recorded)
    assert list(back) == list(spans)
    for name in spans:
        assert back[name] == pytest.approx(spans[name])
    with pytest.raises(TypeError, match="accuracy_spans"):
        claims.accuracy_spans([0.3])


def test_listops_table_fits_80_columns_and_says_when_there_is_no_recording():
    live = _tiny_comparison()
    recorded = {
        "seeds": [0, 1, 2],
        "chance": 0.1,
        "majority": 0.1135,
        "summary": {
            "softmax": {"mean": 0.309, "low": 0.299, "high": 0.3185},
            "moh": {"mean": 0.3, "low": 0.3, "high": 0.3},
        },
    }
    table = claims.listops_table(live, recorded)
    lines = table.splitlines()
    assert max(map(len, lines)) <= 80
    assert "live (2 seeds)" in lines[0] and "recorded (3 seeds)" in lines[0]
    assert any(line.startswith(claims.VARIANTS["softmax"].title) and "0.309 (0.299-0.319)" in line for line in lines)
    moh = next(line for line in lines if line.startswith(claims.VARIANTS["moh"].title))
    assert "-" in moh.split() and moh.endswith("0.300 (0.300-0.300)")  # live has no MoH run
    assert "0.10 / 0.114" in lines[-1] or "0.10 / 0.113" in lines[-1]
    alone = claims.listops_table(live, None)
    assert "no recording here" in alone.splitlines()[0] and max(map(len, alone.splitlines())) <= 80
    with pytest.raises(TypeError, match="listops_table"):
        claims.listops_table(recorded)


def test_head_width_spans_and_table_read_a_study_and_its_recording():
    task = claims.HEADS_TASK
    setup = Setup(d_model=8, n_heads=2, n_layers=1, batch=4, steps=2, lr=1e-3, warmup=1, eval_every=1, eval_size=8)
    study = claims.head_width_study(task, setup, widths=(2, 4), variants=("linear", "mobile"), seeds=2)
    spans = claims.head_width_spans(study)
    assert set(spans) == {"linear", "mobile"} and set(spans["linear"]) == {2, 4}
    acc, rank = spans["linear"][2]["accuracy"], spans["linear"][2]["rank"]
    assert acc[1] <= acc[0] <= acc[2] and rank[1] <= rank[0] <= rank[2] and 0 <= rank[2] <= 2 + 1e-9
    recorded = json.loads(json.dumps(study.to_dict()))
    back = claims.head_width_spans(recorded)
    assert back["mobile"][4]["accuracy"] == pytest.approx(spans["mobile"][4]["accuracy"])
    assert back["mobile"][4]["rank"] == pytest.approx(spans["mobile"][4]["rank"])
    recorded.setdefault("seeds", [0, 1])
    table = claims.head_width_table(study, recorded)
    assert max(map(len, table.splitlines())) <= 70  # the website's output column
    assert "live: 2 steps, 2 seeds" in table and "recorded: 2 steps, 2 seeds" in table
    assert sum(line[:1].isdigit() for line in table.splitlines()) == 4
    assert "no recording here" in claims.head_width_table(study)
    alone = claims.head_width_study(task, setup, widths=(2,), variants=("linear",), seeds=1)
    single = claims.head_width_table(alone)  # one seed: "1 seed", and no range of one value
    assert "live: 2 steps, 1 seed;" in single and "(" not in single.splitlines()[-1], single
    with pytest.raises(TypeError, match="head_width_spans"):
        claims.head_width_spans([1])


def test_the_new_examples_run():
    import doctest

    for fn in (claims.effective_rank, claims.accuracy_spans, claims.head_width_spans):
        finder = doctest.DocTestFinder()
        runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
        for test in finder.find(fn, globs={"torch": torch, **vars(claims)}):
            runner.run(test)
        assert runner.failures == 0 and runner.tries > 0, fn.__name__
