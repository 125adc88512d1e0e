"""attnbook.lab.headtohead: the recall task is what it says, every mechanism plugs into the model, training runs."""

import matplotlib

matplotlib.use("Agg")

import math  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from attnbook.lab import headtohead as h2h  # noqa: E402

TASK = h2h.RecallTask(n_pairs=5, n_keys=9, n_values=4)


def test_the_target_is_the_value_of_the_fact_whose_key_the_query_names():
    tokens, target = TASK.batch(200, torch.Generator().manual_seed(0))
    assert tokens.shape == (200, TASK.length) and target.shape == (200,)
    facts, query = tokens[:, :-1], tokens[:, -1]
    keys, values = facts // TASK.n_values, facts % TASK.n_values
    q_key = query - TASK.n_keys * TASK.n_values
    assert (q_key >= 0).all() and (q_key < TASK.n_keys).all()
    for b in range(200):
        assert len(set(keys[b].tolist())) == TASK.n_pairs  # keys distinct within a sequence
        (hit,) = (keys[b] == q_key[b]).nonzero().flatten().tolist()
        assert values[b, hit] == target[b]
    assert tokens.max() < TASK.vocab and tokens.min() >= 0


def test_batches_are_reproducible_and_targets_cover_every_value():
    a = TASK.batch(64, torch.Generator().manual_seed(3))
    b = TASK.batch(64, torch.Generator().manual_seed(3))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert set(a[1].tolist()) == set(range(TASK.n_values))


def test_impossible_tasks_raise_value_error():
    with pytest.raises(
        ValueError,
        match=r"^RecallTask: n_keys must be an int >= 5 \(n_pairs: the keys of a sequence are distinct\), got 3",
    ):
        h2h.RecallTask(n_pairs=5, n_keys=3)
    with pytest.raises(ValueError, match="n_pairs must be an int >= 1, got 0"):
        h2h.RecallTask(n_pairs=0)
    with pytest.raises(TypeError, match="n_values must be an int"):
        h2h.RecallTask(n_values=2.0)
    with pytest.raises(ValueError, match="size must be an int >= 1"):
        TASK.batch(0, torch.Generator())
    with pytest.raises(TypeError, match="^RecallTask.batch: generator must be a torch.Generator, got 0"):
        TASK.batch(4, 0)


def test_fields_decode_every_token_into_its_key_and_value():
    tokens, target = TASK.batch(50, torch.Generator().manual_seed(1))
    key, value, is_query = TASK.fields(tokens)
    assert is_query[:, -1].all() and not is_query[:, :-1].any()
    assert torch.equal(tokens[:, :-1], key[:, :-1] * TASK.n_values + value[:, :-1])
    assert (value[:, -1] == 0).all()
    (hit_b, hit_j) = (key[:, :-1] == key[:, -1:]).nonzero().T  # the fact each query names
    assert torch.equal(hit_b, torch.arange(50)) and torch.equal(value[hit_b, hit_j], target)


def test_factored_embedding_is_key_plus_value_plus_role():
    emb = h2h.RecallEmbedding(TASK, 6)
    tokens, _ = TASK.batch(4, torch.Generator().manual_seed(2))
    key, value, _ = TASK.fields(tokens)
    out = emb(tokens)  # (4, N, 6)
    fact = emb.key(key[:, :-1]) + emb.value(value[:, :-1]) + emb.role.weight[0]
    query = emb.key(key[:, -1]) + emb.role.weight[1]
    torch.testing.assert_close(out[:, :-1], fact)
    torch.testing.assert_close(out[:, -1], query)
    with pytest.raises(TypeError, match="task must be a RecallTask"):
        h2h.RecallEmbedding("recall", 6)


@pytest.mark.parametrize("mechanism", h2h.MECHANISMS)
def test_every_mechanism_plugs_into_the_model_and_gets_gradients(mechanism):
    model = h2h.TinyModel(
        mechanism, vocab=TASK.vocab, length=TASK.length, n_out=TASK.n_values, d_model=16, n_heads=4, n_layers=1
    )
    tokens, target = TASK.batch(3, torch.Generator().manual_seed(0))
    logits = model(tokens)
    assert logits.shape == (3, TASK.n_values)
    torch.nn.functional.cross_entropy(logits, target).backward()
    attn = model.blocks[0].attn
    assert all(p.grad is not None for p in attn.parameters() if p.requires_grad), mechanism
    assert type(attn).__name__.lower().startswith(mechanism[:4])


def test_bad_mechanism_or_tokens_raise_value_error():
    with pytest.raises(ValueError, match="^TinyModel: mechanism must be one of 'softmax', .*got 'rnn'"):
        h2h.TinyModel("rnn", vocab=10, length=4, n_out=2)
    with pytest.raises(TypeError, match="^TinyModel: mechanism must be one of .*got 3"):
        h2h.TinyModel(3, vocab=10, length=4, n_out=2)
    with pytest.raises(ValueError, match="^TinyModel: d_model must be a multiple of n_heads, got d_model=8, n_heads=3"):
        h2h.TinyModel("linear", vocab=10, length=4, n_out=2, d_model=8, n_heads=3)
    with pytest.raises(TypeError, match="^TinyModel: embedding must be an nn.Module, got 'table'"):
        h2h.TinyModel("linear", vocab=10, length=4, n_out=2, embedding="table")
    model = h2h.TinyModel("linear", vocab=10, length=4, n_out=2, d_model=8, n_heads=2, n_layers=1)
    with pytest.raises(
        ValueError, match=r"^TinyModel: tokens must have N <= 4 \(length\), got a int64 tensor of shape \(2, 5\)"
    ):
        model(torch.zeros(2, 5, dtype=torch.long))
    with pytest.raises(ValueError, match=r"^TinyModel: tokens must have 2 dimensions \(B, N\)"):
        model(torch.zeros(5, dtype=torch.long))
    with pytest.raises(TypeError, match="^TinyModel: tokens must be a torch.Tensor, got a list"):
        model([[1, 2]])


def test_training_curve_is_complete_and_learning_happens():
    curve = h2h.train(
        "softmax",
        h2h.RecallTask(n_pairs=4, n_keys=8, n_values=4),
        steps=120,
        eval_every=40,
        d_model=32,
        n_layers=1,
        lr=1e-2,
    )
    assert curve.steps == [0, 40, 80, 120]
    assert curve.wall_s[0] == 0 and all(b > a for a, b in zip(curve.wall_s, curve.wall_s[1:], strict=False))
    assert len(curve.accuracy) == len(curve.loss) == 4
    assert curve.final_accuracy > 0.5  # chance is 1/4
    assert curve.loss[-1] < curve.loss[0]


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (dict(steps=0), ValueError, "train: steps must be an int >= 1, got 0"),
        (dict(steps=2.5), TypeError, "train: steps must be an int"),
        (dict(lr=0.0), ValueError, "train: lr must be a finite number > 0"),
        (dict(lr=float("nan")), ValueError, "lr must be a finite number"),
        (dict(batch=-1), ValueError, "batch must be an int >= 1"),
        (dict(eval_every=0), ValueError, "eval_every must be an int >= 1"),
        (dict(seed=-1), ValueError, "seed must be an int >= 0"),
        (dict(stop_at=1.5), ValueError, "stop_at must be a finite number > 0 and <= 1"),
        (dict(factored="yes"), TypeError, "factored must be True or False"),
    ],
    ids=["steps-0", "steps-float", "lr-0", "lr-nan", "batch", "eval-every", "seed", "stop-at", "factored"],
)
def test_train_names_the_bad_argument(kwargs, error, message):
    with pytest.raises(error, match=message):
        h2h.train("linear", TASK, **kwargs)


def test_train_refuses_an_unknown_mechanism_or_task():
    with pytest.raises(ValueError, match="^train: mechanism must be one of 'softmax', .*got 'rnn'"):
        h2h.train("rnn", TASK)
    with pytest.raises(TypeError, match=r"^train: task must be a RecallTask, got a tuple of length 3"):
        h2h.train("linear", (5, 9, 4))


def test_stop_at_ends_training_once_accuracy_stays_there():
    kw = dict(steps=40, eval_every=4, d_model=16, n_layers=1, eval_size=32, lr=1e-2)
    full = h2h.train("softmax", TASK, **kw)
    stopped = h2h.train("softmax", TASK, stop_at=0.05, **kw)  # reached at the first evaluations
    assert full.steps[-1] == 40 and stopped.steps == [0, 4, 8]
    assert stopped.accuracy == full.accuracy[:3]  # the same run, cut short


def test_same_seed_same_curve():
    kw = dict(steps=6, eval_every=3, d_model=16, n_layers=1, eval_size=32)
    a, b = h2h.train("flow", TASK, **kw), h2h.train("flow", TASK, **kw)
    assert a.accuracy == b.accuracy and a.loss == b.loss


def test_plot_curves_draws_one_line_per_mechanism_and_chance():
    curves = [
        h2h.Curve("a", [0, 1], [0.0, 1.0], [0.1, 0.5], [1.0, 0.5]),
        h2h.Curve("b", [0, 1], [0.0, 2.0], [0.1, 0.3], [1.0, 0.7]),
    ]
    ax = h2h.plot_curves(curves, chance=0.25)
    assert len(ax.lines) == 3
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["a", "b", "chance"]


def _race():
    kw = dict(steps=8, eval_every=4, d_model=16, n_heads=2, n_layers=1, eval_size=32)
    return h2h.race(TASK, mechanisms=["softmax", "linear"], seeds=[0, 3], keep_models=True, **kw)


def test_race_runs_every_mechanism_for_every_seed_and_summarises_them():
    race = _race()
    assert race.mechanisms == ["softmax", "linear"]
    assert [c.seed for c in race.curves["linear"]] == [0, 3]
    assert all(c.model is not None for cs in race.curves.values() for c in cs)
    final = race.final("linear")
    s = race.summary("linear")
    assert s.seeds == 2 and s.low == min(final) and s.high == max(final) and s.spread == s.high - s.low
    assert s.mean == pytest.approx(sum(final) / 2) and s.step_ms > 0
    steps, mean, low, high = race.mean_curve("softmax")
    assert steps == [0, 4, 8] and all(lo <= m <= hi for m, lo, hi in zip(mean, low, high, strict=True))
    # a race of one seed is the train() run of that seed
    alone = h2h.train("linear", TASK, seed=3, steps=8, eval_every=4, d_model=16, n_heads=2, n_layers=1, eval_size=32)
    assert race.curves["linear"][1].accuracy == alone.accuracy
    with pytest.raises(ValueError, match="^Race: mechanism must be one of 'softmax', 'linear', got 'flow'"):
        race.summary("flow")


def test_mean_curve_carries_a_stopped_run_at_its_final_accuracy_and_late_gain_reads_it():
    a = h2h.Curve("linear", [0, 10, 20, 30, 40], [0, 1, 2, 3, 4], [0.1, 0.5, 0.8, 0.9, 0.95], [1] * 5, seed=0)
    b = h2h.Curve("linear", [0, 10, 20], [0, 1, 2], [0.1, 0.99, 0.99], [1] * 3, seed=1)
    race = h2h.Race(TASK, {"linear": [a, b]})
    steps, mean, low, high = race.mean_curve("linear")
    assert steps == [0, 10, 20, 30, 40]
    assert mean == pytest.approx([0.1, 0.745, 0.895, 0.945, 0.97]) and high[-1] == 0.99 and low[-1] == 0.95
    assert race.late_gain("linear", 0.25) == pytest.approx(0.97 - 0.945)
    assert race.late_gain("linear", 0.5) == pytest.approx(0.97 - 0.895)
    assert race.steps_to("linear", 0.9) == [30, 10]


def test_race_validates_its_arguments():
    with pytest.raises(
        ValueError, match=r"^race: mechanisms must be among 'softmax', .*got unknown mechanisms \['rnn'\]"
    ):
        h2h.race(TASK, mechanisms=["rnn"])
    with pytest.raises(ValueError, match="^race: mechanisms must hold at least 1 mechanism, got 0 mechanisms"):
        h2h.race(TASK, mechanisms=[])
    with pytest.raises(TypeError, match="^race: mechanisms must be a sequence .*got 'flow'"):
        h2h.race(TASK, mechanisms="flow")
    with pytest.raises(ValueError, match="^race: seeds must hold at least 1 seed, got 0 seeds"):
        h2h.race(TASK, seeds=[])
    with pytest.raises(ValueError, match="seeds must be an int >= 1, got 0"):
        h2h.race(TASK, seeds=0)
    with pytest.raises(TypeError, match="seeds must be an int"):
        h2h.race(TASK, seeds=[1.5])


@pytest.mark.parametrize("mechanism", h2h.MECHANISMS)
def test_effective_weights_are_what_each_layer_does_to_its_values(mechanism):
    """Every mechanism is linear in its values: o = A v with A from the queries and keys only."""
    torch.manual_seed(0)
    attn = h2h.mechanisms.get(mechanism).module(8, 2).double()
    h = torch.randn(3, 5, 8, dtype=torch.float64)
    A = h2h._head_weights(attn, h)  # (B, H, N, N)
    assert A.shape == (3, 2, 5, 5)
    if mechanism == "moh":
        torch.testing.assert_close(A.sum(-1), torch.ones(3, 2, 5, dtype=torch.float64))
        return
    q = attn.query_projection(h).view(3, 5, 2, 4).transpose(1, 2)
    k = attn.key_projection(h).view(3, 5, 2, 4).transpose(1, 2)
    v = torch.randn(3, 2, 5, 4, dtype=torch.float64)
    torch.testing.assert_close(attn.attend(q, k, v), A @ v)


def test_lookup_share_of_a_hand_made_perfect_lookup_is_one():
    task = h2h.RecallTask(n_pairs=3, n_keys=4, n_values=3)
    model = h2h.TinyModel("softmax", vocab=task.vocab, length=task.length, n_out=3, d_model=8, n_heads=2, n_layers=1)
    tokens, _ = task.batch(10, torch.Generator().manual_seed(0))
    share = h2h.lookup_share(model, tokens, task)
    assert share.shape == (10, 2) and ((share > 0) & (share <= 1)).all()
    # the query's softmax row over P + 1 = 4 tokens, recomputed by hand
    block = model.blocks[0]
    hidden = block.norm1(model.embed_tokens(tokens))
    q = block.attn.query_projection(hidden).view(10, 4, 2, 4).transpose(1, 2)
    k = block.attn.key_projection(hidden).view(10, 4, 2, 4).transpose(1, 2)
    row = torch.softmax(q[:, :, -1:] @ k.transpose(-2, -1) / 2.0, dim=-1)[:, :, 0]  # (10, 2, 4)
    key, _, _ = task.fields(tokens)
    j = (key[:, :-1] == key[:, -1:]).float().argmax(-1)  # (10,)
    torch.testing.assert_close(share, row[torch.arange(10), :, j].detach())
    with pytest.raises(TypeError, match="^lookup_share: model must be a TinyModel, got a Block module"):
        h2h.lookup_share(block, tokens, task)


def test_operator_count_counts_forward_and_backward_and_leaves_gradients_alone():
    task = TASK
    tokens, target = task.batch(4, torch.Generator().manual_seed(0))
    counts = {}
    for m in ("softmax", "mobile"):
        model = h2h.TinyModel(m, vocab=task.vocab, length=task.length, n_out=task.n_values, d_model=8, n_heads=2)
        counts[m] = h2h.operator_count(model, tokens, target)
        assert all(p.grad is None for p in model.parameters())
        assert h2h.operator_count(model, tokens, target) == counts[m]  # deterministic
    assert 50 < counts["softmax"] < counts["mobile"]
    with pytest.raises(TypeError, match="^operator_count: model must be an nn.Module, got <function"):
        h2h.operator_count(lambda t: t, tokens, target)


def test_plot_race_draws_a_mean_line_and_band_per_mechanism_and_the_shares():
    race = _race()
    fig = h2h.plot_race(race, shares={"softmax": [0.9, 0.8], "linear": [0.5, 0.6]})
    by_step, bars = fig.axes
    labels = [t.get_text() for t in by_step.get_legend().get_texts()]
    assert labels == ["softmax", "linear", "chance"]
    assert len(by_step.collections) == 2  # one band per mechanism
    assert [round(p.get_height(), 2) for p in bars.patches] == [0.85, 0.55]
    assert fig.get_figwidth() <= 7.5
    with pytest.raises(
        ValueError, match=r"^plot_race: shares must be among 'softmax', 'linear', got unknown shares \['flow'\]"
    ):
        h2h.plot_race(race, shares={"flow": [1.0]})
    with pytest.raises(TypeError, match="^plot_race: result must be a Race, got"):
        h2h.plot_race(race.curves)


# ------------------------------------------------------------------ the figures of chapters 5 and 6 (viz.plots)


def test_scaling_panels_styles_every_mechanism_and_shares_one_legend():
    from attnbook.viz import plots, style

    ns = [128, 256, 512]
    panels = {
        "forward (s)": {"softmax": [1, 4, 16], "linear_causal": [1, 2, 4], "skipped": [math.nan] * 3},
        "memory (B)": {"softmax": [1, 2, 4], "linear_causal": [2, 4, 8], "skipped": [math.nan] * 3},
    }
    fig = plots.scaling_panels(ns, panels, title="t")
    axes = fig.axes
    assert fig.get_figwidth() == style.PAGE_WIDTH and len(axes) == 4
    lines = {line.get_label(): line for line in axes[0].get_lines()}
    assert "skipped" not in lines  # NaN everywhere: left out
    assert lines["softmax"].get_color() == style.colour("softmax")
    assert lines["linear_causal"].get_linestyle() == "--"  # causal: dashed
    assert {lines["∝ N^1"].get_linestyle(), lines["∝ N^2"].get_linestyle()} == {":", "-."}  # guides differ
    assert axes[0].get_legend() is None and not axes[2].axison  # two panels: the third cell is empty
    legend = [t.get_text() for t in axes[3].get_legend().get_texts()]
    assert legend[:2] == ["softmax", "linear_causal"]
    with pytest.raises(ValueError, match="1 to 3 panels"):
        plots.scaling_panels(ns, {})


def test_scaling_plot_styles_are_opt_in():
    import matplotlib.pyplot as plt

    from attnbook.viz import plots

    _, ax = plt.subplots()
    plots.scaling_plot([1, 2], {"flow": [1, 2]}, ylabel="y", ax=ax, reference_slopes=(1,))
    flow, guide = ax.get_lines()
    assert guide.get_linestyle() == ":" and ax.get_legend() is not None
    from matplotlib.colors import to_hex

    assert to_hex(flow.get_color()) == "#1f77b4"  # matplotlib's first colour: mechanism styles are opt-in
    plt.close("all")


def test_curves_and_maps_draws_curves_above_and_maps_on_one_scale_below():
    from attnbook.viz import plots, style

    fig = plots.curves_and_maps(
        {"routed": [1.0, 0.5, 0.1], "all heads": [1.0, 0.9, 0.8]},
        {"before": torch.full((2, 3), 0.25), "after": torch.tensor([[0.9, 0.1, 0.0], [0.0, 0.2, 0.8]])},
        styles={"routed": dict(color=style.colour("moh"))},
    )
    assert fig.get_figwidth() == style.PAGE_WIDTH
    curve_ax = next(ax for ax in fig.axes if ax.get_lines())
    assert [line.get_label() for line in curve_ax.get_lines()] == ["routed", "all heads"]
    assert curve_ax.get_lines()[0].get_color() == style.colour("moh") and curve_ax.get_yscale() == "log"
    images = [ax.images[0] for ax in fig.axes if ax.images]
    assert len(images) == 2 and all(im.get_clim() == pytest.approx((0.0, 0.9)) for im in images)  # one scale
    texts = [t.get_text() for ax in fig.axes if ax.images for t in ax.texts]
    assert "0.90" in texts and "0.25" in texts  # annotated cells
    with pytest.raises(ValueError, match="^curves_and_maps: curves must hold at least 1 curve, got 0 curves$"):
        plots.curves_and_maps({}, {"a": torch.ones(1, 1)})


# ------------------------------------------------------------------ chapter 6's plumbing: recordings, tables, claims


def _bench_result(times=None, memory=None, backward=True, samples_spread=1.0):
    """A run_benchmark-shaped result: forward time per mechanism and N (and forward+backward twice it)."""
    ns = [256, 512, 1024]
    times = times or {
        "softmax": [1.0, 4.0, 16.0],
        "softmax_causal": [1.0, 3.0, 9.0],
        "linear": [2.0, 3.0, 5.0],
        "linear_causal": [4.0, 5.0, 8.0],
        "flow": [0.5, 5.0, 20.0],  # faster at 256 only: it does not stay faster
    }
    records = []
    for name, ys in times.items():
        for n, y in zip(ns, ys, strict=True):
            records.append({
                "mechanism": name, "N": n, "forward_s": y, "forward_samples_s": [y, y * samples_spread],
                "forward_backward_s": 2 * y if backward else None,
                "forward_peak_bytes": (memory or {}).get(name, ns)[ns.index(n)],
            })  # fmt: skip
    return {"config": {"lengths": ns}, "records": records, "environment": {"device": "cpu"}}


def test_crossovers_are_the_first_n_from_which_a_mechanism_stays_faster():
    cross = h2h.crossovers(_bench_result())
    assert cross == {"linear": 512, "linear_causal": 1024, "flow": None}
    fast = _bench_result({"softmax": [2, 4, 8], "softmax_causal": [2, 4, 8], "linear": [1, 1, 1]})
    assert h2h.crossovers(fast) == {"linear": 256}
    assert h2h.describe_crossover(256, [256, 512]) == "already at N = 256"
    assert h2h.describe_crossover(512, [256, 512]) == "from N = 512"
    assert h2h.describe_crossover(None, [256, 512]) == "nowhere in this range"


def test_sample_spread_steadiness_and_noisy_records_read_the_samples():
    steady, noisy = _bench_result(), _bench_result(samples_spread=5.0)
    assert h2h.sample_spread(steady, "linear") == [1.0, 1.0, 1.0]
    assert h2h.sample_spread(noisy, "linear") == [5.0, 5.0, 5.0]
    assert h2h.steadiness(steady) == 1.0 and h2h.steadiness(noisy) == 5.0
    assert h2h.noisy_records(steady) == set() and ("flow", 512) in h2h.noisy_records(noisy)
    table = h2h.ratio_table(noisy).splitlines()
    assert table[0].split()[-3:] == ["256", "512", "1024"]
    linear = next(line for line in table if line.startswith("linear "))
    assert linear.split() == ["linear", "2.00*", "0.75*", "0.31*"]  # over SDPA; * = samples spread > 3x
    assert max(len(line) for line in table) <= 80


def test_slopes_table_fits_every_panel_and_leaves_out_the_moh_layer():
    result = _bench_result({"softmax": [1, 4, 16], "linear": [0.5, 1, 2], "moh": [1, 4, 16]})
    rows = {line.split()[0]: line.split() for line in h2h.slopes_table(result).splitlines()[1:]}
    assert set(rows) == {"softmax", "linear"}
    assert rows["softmax"][1:5] == ["2.00", "2.00", "1.00", "2.0"]
    assert rows["linear"][1:4] == ["1.00", "1.00", "1.00"] and rows["linear"][5:] == ["already", "at", "N", "=", "256"]
    no_backward = h2h.slopes_table(_bench_result({"softmax": [1, 4, 16]}, backward=False))
    assert no_backward.splitlines()[1].split()[1:5] == ["2.00", "-", "1.00", "nan"]


def test_benchmark_recordings_are_read_from_the_repository_and_only_bench_results(tmp_path):
    import json

    results = tmp_path / "repo" / "benchmarks" / "results"
    (results / "ch07").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (results / "cpu.json").write_text(json.dumps(_bench_result()))
    (results / "annex.json").write_text(json.dumps({"records": [{"t": 16}], "environment": {}}))
    (results / "notes.json").write_text(json.dumps({"hello": 1}))
    found = h2h.benchmark_recordings(start=tmp_path / "repo" / "benchmarks")
    assert list(found) == ["cpu.json"] and found["cpu.json"]["config"]["lengths"] == [256, 512, 1024]
    assert h2h.benchmark_recordings(start=tmp_path / "elsewhere") == {}  # no repository: nothing, no error


def test_benchmark_figure_draws_one_panel_per_measured_metric():
    import matplotlib.pyplot as plt

    fig = h2h.benchmark_figure(_bench_result(backward=False), title="live")
    shown = [ax for ax in fig.axes if ax.axison]
    assert [ax.get_ylabel() for ax in shown] == ["forward (s)", "forward peak memory (B)"]
    labels = {line.get_label() for line in shown[0].get_lines()}
    assert {"softmax", "linear", "flow"} <= labels
    plt.close(fig)


@pytest.mark.parametrize(
    "shared, routed, rows",
    [(1, 2, 3 + 2), (2, 2, 2 + 2 + 2), (0, 2, 4)],
    ids=["one shared head: no shared router", "two shared heads", "no shared head: no two-stage split"],
)
def test_router_rows_count_what_the_layer_has(shared, routed, rows):
    from attnbook import MoHAttention

    layer = MoHAttention(16, num_heads=4, shared_head=shared, routed_head=routed)
    assert h2h.router_rows(layer) == rows
    E = layer.num_routed
    assert rows == E + (2 if shared else 0) + (shared if shared > 1 else 0)


def _claims():
    summary = {"mean": 0.3, "low": 0.29, "high": 0.31}
    listops = {"summary": {"softmax": summary, "flow": {**summary, "mean": 0.28}}, "chance": 0.1, "majority": 0.11}
    heads = {"rows": [{"variant": v, "head_dim": 2, "accuracy": {"mean": a}, "rank_trained": [r, r]}
                      for v, a, r in (("linear", 0.67, 1.0), ("mobile", 0.92, 1.3))]}  # fmt: skip
    moh = {"curve": [{"fraction": f, "accuracy": {"mean": a}} for f, a in ((0.25, 0.67), (0.5, 0.996), (1.0, 1.0))],
           "softmax": {"accuracy": {"mean": 1.0}}, "fewer_heads": [{"variant": "mha_2", "accuracy": {"mean": 0.98}}],
           "lookups": {"5": {"curve": [{"fraction": 1.0, "accuracy": {"mean": 0.17}}],
                             "softmax": {"accuracy": {"mean": 0.97}}}}}  # fmt: skip
    lookup = {"demos": [{"n_tokens": 6, "dim": 8, "rescaled": {"linear": [0.2, 0.3]}, "trained": {"linear": 1.0}}]}
    writing = {
        "summary": {"eager": {"softmax_over": {"linear": 3.8}}, "compiled": {"softmax_over": {"linear": 9.0}}},
        "config": {"positions": [16, 8192], "decoders": ["eager", "compiled"]},
    }
    return {"listops": listops, "heads": heads, "moh": moh, "lookup": lookup, "writing": writing}


def test_claim_numbers_name_every_recorded_number_and_leave_out_absent_recordings():
    numbers = h2h.claim_numbers(_claims())
    assert numbers["listops flow"] == 0.28 and numbers["listops softmax low"] == 0.29
    assert numbers["listops chance"] == 0.1 and numbers["listops majority"] == 0.11
    assert numbers["heads mobile D=2"] == 0.92 and numbers["rank mobile D=2"] == pytest.approx(1.3)
    assert numbers["moh 0.5"] == 0.996 and numbers["moh 1"] == 1.0 and numbers["moh softmax"] == 1.0
    assert numbers["moh mha_2"] == 0.98  # the control
    assert numbers["moh 1 lookups=5"] == 0.17 and numbers["moh softmax lookups=5"] == 0.97
    assert numbers["lookup rescaled low linear 6x8"] == 0.2 and numbers["lookup rescaled high linear 6x8"] == 0.3
    assert numbers["lookup trained linear 6x8"] == 1.0
    assert numbers["writing ratio"] == 3.8 and numbers["writing t"] == 8192
    assert h2h.claim_numbers({name: None for name in _claims()}) == {}
    assert "listops flow" not in h2h.claim_numbers({**_claims(), "listops": None})


def test_claims_summary_prints_each_study_within_the_website_s_output_column():
    text = h2h.claims_summary(h2h.claim_numbers(_claims()))
    assert "flow                 0.280 (0.290-0.310)" in text
    assert "    D          linear          mobile" in text
    assert "    2    0.670 (1.00)    0.920 (1.30)" in text
    assert "25 %: 0.670   50 %: 0.996   100 %: 1.000   softmax: 1.000" in text
    assert "plain attention with only 2 heads: 0.980" in text  # the control
    assert "5 look-ups: MoH at most 0.170, softmax 0.970" in text
    assert max(len(line) for line in text.splitlines()) <= 72
    assert h2h.claims_summary({}) == "no recordings here (clone the repository to see them)"


def test_advice_rows_quote_the_measurements_and_say_what_is_not_recorded():
    race = _race()
    shares = {"softmax": [0.9, 0.8], "linear": [0.5, 0.7]}
    kw = dict(
        time_slopes={"softmax": 2.0, "linear": 1.0}, memory_slopes={"softmax": 1.0, "linear": 1.0},
        crossovers={"linear": 512}, lengths=[256, 512], layer_ratios=[1.1],
    )  # fmt: skip
    rows = h2h.advice_rows(race, shares, numbers=h2h.claim_numbers(_claims()), **kw)
    assert [r[0] for r in rows] == ["<b>softmax</b>", "<b>linear</b>"] and all(len(r) == 4 for r in rows)
    assert "time ~ N<sup>2.0</sup>" in rows[0][1] and "lookup share 0.85" in rows[0][1]
    assert "faster than SDPA from N = 512 (CPU)" in rows[1][1] and "3.8x quicker than softmax" in rows[1][1]
    assert "Katharopoulos" in rows[1][2]
    assert "quickest below N = 512 (the crossovers; on a GPU expected later, not measured)" in rows[0][3]
    spread = h2h.advice_rows(race, shares, numbers={}, **{**kw, "crossovers": {"linear": 256, "flow": 1024}})
    assert "below N = 256 to 1024 (the crossovers;" in spread[0][3]
    none = h2h.advice_rows(race, shares, numbers={}, **{**kw, "crossovers": {"linear": None}})
    assert "quickest at every length measured (no crossover; on a GPU" in none[0][3]
    bare = h2h.advice_rows(race, shares, numbers={}, **kw)
    assert "ListOps (not recorded here)" in bare[0][1]
    assert "recall of many pairs (chapter 8) (not recorded here)" in bare[1][1] and len(bare) == 2
    study = {"recall pairs": 64}
    for key, (mean, low, high) in {"linear 32": (0.5, 0.4, 0.6), "linear 64": (0.79, 0.77, 0.8),
                                   "delta 64": (0.94, 0.9, 0.97), "decay 64": (0.82, 0.75, 0.9),
                                   "gated 64": (0.6, 0.5, 0.7), "softmax 64": (1.0, 1.0, 1.0)}.items():  # fmt: skip
        study[f"recall {key}"], study[f"recall {key} low"], study[f"recall {key} high"] = mean, low, high
    recalled = h2h.advice_rows(race, shares, numbers=study, **kw)
    assert [r[0] for r in recalled] == ["<b>softmax</b>", "<b>linear</b>", "<b>decay</b>", "<b>gated</b>",
                                        "<b>delta</b>"]  # fmt: skip
    assert "recall of 64 pairs (chapter 8) 0.50 at width 32, 0.79 at width 64" in recalled[1][1]
    assert "recalled more than linear attention at width 64 (0.94 against 0.79, seeds 0.90-0.97" in recalled[4][3]
    assert "recalled within the seeds' spread of linear attention at width 64 (0.82 against 0.79" in recalled[2][3]
    assert "recalled less than linear attention at width 64 (0.60" in recalled[3][3]
    study.update({"recall delta 32": 0.2, "recall delta 32 low": 0.1, "recall delta 32 high": 0.3})
    both = h2h.advice_rows(race, shares, numbers=study, **kw)[4][3]  # every width with linear's beside it
    assert "less than linear attention at width 32 (0.20 against 0.50" in both and "more than" in both
    html = h2h.html_table(["a", "b"], [["1", "2"]])
    assert html == "<table><tr><th>a</th><th>b</th></tr><tr><td>1</td><td>2</td></tr></table>"


def test_advice_rows_mark_what_is_the_papers_claim_and_back_the_rest_with_numbers():
    curves = {m: [h2h.Curve(m, [0, 10], [0.0, 0.1], [0.2, 0.9], [1.0, 0.5])] for m in ("flow", "mobile", "moh")}
    race = h2h.Race(TASK, curves)
    shares = {m: [0.8] for m in curves}
    claims = _claims()
    claims["heads"]["rows"] += [{"variant": v, "head_dim": 4, "accuracy": {"mean": a}, "rank_trained": [2.0]}
                                for v, a in (("linear", 0.951), ("mobile", 1.0))]  # fmt: skip
    kw = dict(
        time_slopes={"flow": 0.8, "mobile": 0.9}, memory_slopes={"flow": 1.0, "mobile": 1.0},
        crossovers={"flow": 512, "mobile": 512}, lengths=[256, 512], layer_ratios=[1.29, 1.11, 0.84],
    )  # fmt: skip
    flow, mobile, moh = h2h.advice_rows(race, shares, numbers=h2h.claim_numbers(claims), **kw)
    assert "Wu et al. (2022)" in flow[2] and "not reproduced" in flow[2] and flow[3].startswith("the paper's claim")
    assert "at D = 4 recall 1.000 against linear's 0.951" in mobile[3]
    assert "vision transformers" in mobile[3] and "its claim, not tested here" in mobile[3]
    assert "no time saved (0.84x to 1.29x a softmax layer's time)" in moh[3] and "Jin et al. (2024)" in moh[2]
    bare = h2h.advice_rows(race, shares, numbers={}, **kw)
    assert "at D = 4 recall (not recorded here)" in bare[1][3]


def test_the_race_tables_read_the_trained_models():
    race = _race()
    probe, target = TASK.batch(16, torch.Generator().manual_seed(1))
    shares = h2h.best_head_shares(race, probe)
    assert set(shares) == {"softmax", "linear"} and all(len(v) == 2 and all(0 <= x <= 1 for x in v)
                                                         for v in shares.values())  # fmt: skip
    best = h2h.lookup_share(race.curves["linear"][1].model, probe, TASK).max(-1).values.mean().item()
    assert shares["linear"][1] == pytest.approx(best)
    ops = h2h.operator_counts(race, probe, target)
    assert ops["linear"] == h2h.operator_count(race.curves["linear"][0].model, probe, target)
    table = h2h.race_table(race, shares, ops).splitlines()
    assert len(table) == 4 and table[2].startswith("softmax ") and max(map(len, table)) <= 80
    no_models = h2h.Race(TASK, {"linear": [h2h.Curve("linear", [0], [0.0], [0.5], [1.0])]})
    with pytest.raises(ValueError, match="keep its models"):
        h2h.best_head_shares(no_models, probe)


def test_mean_steps_to_counts_a_seed_that_never_got_there_with_its_budget():
    a = h2h.Curve("linear", [0, 10, 20], [0, 1, 2], [0.1, 0.95, 0.99], [1] * 3, seed=0)
    b = h2h.Curve("linear", [0, 10, 20], [0, 1, 2], [0.1, 0.5, 0.6], [1] * 3, seed=1)
    race = h2h.Race(TASK, {"linear": [a, b]})
    assert race.mean_steps_to("linear", 0.9) == pytest.approx((10 + 20) / 2)


def test_the_gpu_report_is_summarised_section_by_section():
    """gpu_report_lines on a report with every section: counts per dtype and mode, and the goals' numbers."""
    acc = [
        {"mechanism": m, "dtype": d, "compile": "eager", "passed": m != "flow" or d != "float16", "worst": w}
        for m, w in (("linear", 0.2), ("flow", 1.5))
        for d in ("float32", "float16")
    ]
    impl = {"median_s": 0.007, "speedup_vs_sdpa": 20.0, "times_memory_floor": 13.5}
    report = {
        "environment": {"device_name": "G", "torch": "t", "cuda": "c", "driver": "d"},
        "sections_done": ["accuracy", "sync", "targets"],
        "accuracy": acc,
        "sync": [{"passed": True}, {"passed": False}],
        "targets": {
            "dtype": "bfloat16",
            "shape": {"B": 4, "H": 16, "D": 64},
            "non_causal": {
                "N": 65536,
                "sdpa_s": 0.14,
                "memory_floor_s": 0.0005,
                "impls": {"linear_compiled": impl, "flow_eager": impl},
                "linear": {"best": "linear_compiled", **impl},
                "flow": {"best": "flow_eager", **impl},
            },
            "causal": {
                "N": 16384,
                "sdpa_causal_s": 0.00495,
                "best": "linear_causal_compiled",
                "impls": {"linear_causal_compiled": {"median_s": 0.00484}},
            },
        },
    }
    lines = h2h.gpu_report_lines(report)
    assert lines[0] == "G, torch t, CUDA c, driver d"
    assert lines[1] == "accuracy float32 eager: 2 of 2 pass (worst 1.50 of tolerance)"
    assert lines[2].startswith("accuracy float16 eager: 1 of 2 pass")
    assert lines[3] == "sync: 1 of 2 forwards make the host wait for nothing"
    assert lines[6].split() == ["linear", "65536", "7.00", "140.0", "20.0x", "0.50", "13.5x", "compiled"]
    assert lines[7].split()[-1] == "eager"
    assert lines[8].split() == ["causal", "linear", "16384", "4.84", "4.95", "1.02x", "compiled"]
    assert max(len(line) for line in lines) <= 80  # a page's code block: no sideways scrolling
    assert lines[-1] == "benchmark: not run"
    with pytest.raises(TypeError, match="report"):
        h2h.gpu_report_lines([])
