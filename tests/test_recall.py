"""attnbook.lab.recall: the multi-query recall task asks what it says, the study picks each setting's rate by its
sweep and records what it ran, and the state counts are the layers' own."""

import pytest
import torch

from attnbook.lab import recall
from attnbook.lab.training import NO_ATTENTION


def test_every_key_is_asked_once_and_the_target_is_the_value_written_under_it():
    task = recall.MultiQueryRecall(n_pairs=5, n_keys=9, n_values=7)
    tokens, targets = task.batch(64, torch.Generator().manual_seed(0))
    assert tokens.shape == (64, 10) and targets.shape == (64, 5)
    key, value, is_query = task.fields(tokens)
    assert not is_query[:, :5].any() and is_query[:, 5:].all()
    for b in range(64):
        written = {int(k): int(v) for k, v in zip(key[b, :5], value[b, :5], strict=True)}
        assert len(written) == 5  # distinct keys
        asked = [int(k) for k in key[b, 5:]]
        assert sorted(asked) == sorted(written)  # every key once
        assert [written[k] for k in asked] == targets[b].tolist()


@pytest.mark.parametrize("generator", [None, 0], ids=["none", "seed"])
def test_a_batch_needs_a_generator(generator):
    """None drew from torch's global generator, so a batch could not be made again; a seed is not a generator."""
    with pytest.raises(TypeError, match=r"^MultiQueryRecall.batch: generator must be a torch.Generator"):
        recall.MultiQueryRecall(n_pairs=4).batch(2, generator)


def test_the_model_answers_at_every_position_and_is_causal_where_the_mechanism_can_be():
    task = recall.MultiQueryRecall(n_pairs=4)
    tokens, _ = task.batch(2, torch.Generator().manual_seed(1))
    for name in ("softmax", "delta", "mobile", NO_ATTENTION):
        net = recall.model(name, task, 16).eval()
        logits = net(tokens)
        assert logits.shape == (2, 8, task.n_values)
        changed = tokens.clone()
        changed[:, 6:] = tokens[:, 4:6]  # change the last two queries
        same = torch.allclose(net(changed)[:, :6], logits[:, :6])
        assert same == (name != "mobile"), name  # only Mobile-Attention reads later tokens


def test_a_short_run_learns_something_and_reports_its_curve():
    curve = recall.train("softmax", recall.MultiQueryRecall(n_pairs=4), width=16, steps=60, eval_every=20, lr=1e-2)
    assert curve.steps == [0, 20, 40, 60] and len(curve.accuracy) == 4
    assert curve.accuracy[-1] > 2 / 64  # above chance (1 / 64) after 60 steps


def test_the_study_sweeps_then_runs_more_seeds_at_each_settings_best_rate():
    study = recall.study(("softmax", NO_ATTENTION), pairs=(4,), widths=(16,), lrs=(1e-4, 1e-2), seeds=2, steps=40)
    assert len(study["runs"]) == 2 * 2 + 2 * 1  # a sweep of two rates, then one more seed, per mechanism
    for result in study["results"]:
        sweep = [r for r in study["runs"] if r["mechanism"] == result["mechanism"] and r["seed"] == 0]
        assert result["lr"] == max(sweep, key=lambda r: r["final"])["lr"]
        assert result["seeds"] == [0, 1] and len(result["final"]) == 2
    assert study["results"][0]["state_numbers"] == 2 * 8 * 16  # a KV cache of 8 tokens of width 16
    assert study["results"][1]["state_numbers"] is None  # no attention, no state
    table = recall.table(study, 16)
    assert "softmax" in table and max(map(len, table.splitlines())) <= 9 + 17 + 9  # one number of pairs

    # two cells with a range each stay apart (at 14 columns a cell they ran together: "0.50 (0.25-0.75)0.50 ...")
    result = {"mechanism": "linear", "width": 16, "final": [0.25, 0.75], "mean": 0.5, "state_numbers": 1}
    wide = {"config": {"pairs": [8, 16], "mechanisms": ["linear"]},
            "results": [{**result, "n_pairs": p} for p in (8, 16)]}  # fmt: skip
    assert recall.table(wide, 16).splitlines()[1].split() == ["linear", *["0.50", "(0.25-0.75)"] * 2, "1"]
    # a cell without a range keeps its column: the next cell's mean does not run into it ("1.00 0.96 (...)")
    solid = {**result, "mechanism": "softmax", "final": [1.0, 1.0], "mean": 1.0}
    both = {"config": {"pairs": [8, 16], "mechanisms": ["linear", "softmax"]},
            "results": [{**r, "n_pairs": p} for r in (result, solid) for p in (8, 16)]}  # fmt: skip
    head, ranged, bare = recall.table(both, 16).splitlines()
    assert [head.index("P=16") + 4, ranged.index("0.50", 12) + 4] == [bare.rindex("1.00") + 4] * 2
    wide["config"]["widths"] = [16]
    wide["results"][1] = {**wide["results"][1], "mean": 0.75}
    assert recall.numbers(wide) == {
        "recall pairs": 16,
        "recall linear 16": 0.75,
        "recall linear 16 low": 0.25,
        "recall linear 16 high": 0.75,
    }  # at the most pairs; fmt: skip


def test_state_numbers_are_what_the_layers_carry():
    assert recall.state_numbers("linear", 32, 100) == 4 * 8 * (8 + 1)  # S and z per head, whatever the length
    assert recall.state_numbers("delta", 32, 100) == recall.state_numbers("gated", 32, 7) == 4 * 8 * 8
    assert recall.state_numbers("softmax", 32, 100) == 2 * 100 * 32
    assert recall.state_numbers("mobile", 32, 100) is None


def test_train_refuses_a_single_query_task_and_names_bad_arguments():
    """Chapter 6's RecallTask (one query) trained to a meaningless curve: its targets broadcast against the
    multi-query ones. A bad seed or device failed inside torch."""
    from attnbook.lab.headtohead import RecallTask

    with pytest.raises(TypeError, match=r"^recall.train: task must be a MultiQueryRecall, got RecallTask"):
        recall.train("linear", RecallTask(), steps=1)
    task = recall.MultiQueryRecall(n_pairs=4)
    with pytest.raises(TypeError, match=r"^recall.train: seed must be an int, got 1.5$"):
        recall.train("linear", task, steps=1, seed=1.5)
    with pytest.raises(ValueError, match=r"^recall.train: device must be a device string such as 'cpu'"):
        recall.train("linear", task, steps=1, device="gpu")
