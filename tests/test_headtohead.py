"""attnbook.lab.headtohead: the recall task is what it says, every mechanism plugs into the model, training runs."""

import matplotlib

matplotlib.use("Agg")

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
    with pytest.raises(ValueError, match="distinct keys"):
        h2h.RecallTask(n_pairs=5, n_keys=3)
    with pytest.raises(ValueError, match="n_pairs"):
        h2h.RecallTask(n_pairs=0)


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
    with pytest.raises(ValueError, match="unknown mechanism"):
        h2h.TinyModel("rnn", vocab=10, length=4, n_out=2)
    model = h2h.TinyModel("linear", vocab=10, length=4, n_out=2, d_model=8, n_heads=2, n_layers=1)
    with pytest.raises(ValueError, match="tokens"):
        model(torch.zeros(2, 5, dtype=torch.long))


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
