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
    with pytest.raises(TypeError, match="^lookup_share: model must be a TinyModel, got a _Block module"):
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
