"""attnbook.lab.listops: every label is its expression's value, the bounds hold, batches are reproducible."""

import math
import statistics

import pytest
import torch

from attnbook.lab import listops
from attnbook.lab.listops import PAD, ListOps

SPEC = ListOps(max_depth=3, max_args=4, min_length=10, max_length=40)


def _independent_value(text: str) -> int:
    """Evaluate ListOps text with a recursive-descent parser of its own (not the package's stack machine)."""
    words = text.split()
    ops = {
        "[MAX": max,
        "[MIN": min,
        "[MED": lambda xs: math.floor(statistics.median(xs)),
        "[SM": lambda xs: sum(xs) % 10,
    }

    def parse(i):  # -> (value, next index)
        if words[i] in ops:
            op, args, i = ops[words[i]], [], i + 1
            while words[i] != "]":
                value, i = parse(i)
                args.append(value)
            return op(args), i + 1
        return int(words[i]), i + 1

    value, end = parse(0)
    assert end == len(words), f"trailing words in {text!r}"
    return value


def _arities(text: str) -> list[int]:
    """The number of arguments of every operator in the text."""
    counts, stack = [], []
    for w in text.split():
        if w.startswith("["):
            if stack:
                stack[-1] += 1
            stack.append(0)
        elif w == "]":
            counts.append(stack.pop())
        elif stack:
            stack[-1] += 1
    return counts


@pytest.mark.parametrize(
    "text, value",
    [
        ("[MAX 2 9 [MIN 4 7 ] 0 ]", 9),
        ("[SM [MED 1 5 3 ] 8 ]", 1),
        ("[MED 1 2 3 4 ]", 2),  # even count: floor of the mean of the two middle ones
        ("[MED 1 4 ]", 2),
        ("[MIN [MAX 3 8 ] [SM 9 9 9 ] ]", 7),
    ],
    ids=["max-min", "sm-med", "med-even", "med-two", "min-of-ops"],
)
def test_evaluate_gives_the_value_of_hand_written_expressions(text, value):
    ids = [listops.VOCAB.index(w) for w in text.split()]
    assert listops.evaluate(ids) == value
    assert _independent_value(text) == value
    assert listops.to_text(ids) == text


def test_every_label_is_the_value_of_its_expression_by_an_independent_evaluator():
    expressions, labels = SPEC.sample(400, torch.Generator().manual_seed(0))
    for e, label in zip(expressions, labels, strict=True):
        assert label == _independent_value(listops.to_text(e))
        assert label == listops.evaluate(e)


def test_lengths_depths_and_arities_stay_within_the_bounds_and_reach_them():
    expressions, labels = SPEC.sample(600, torch.Generator().manual_seed(1))
    lengths = [len(e) for e in expressions]
    depths = [listops.depth(e) for e in expressions]
    assert min(lengths) >= SPEC.min_length and max(lengths) <= SPEC.max_length
    assert set(depths) <= set(range(1, SPEC.max_depth + 1)) and SPEC.max_depth in depths
    arities = [a for e in expressions for a in _arities(listops.to_text(e))]
    assert min(arities) == 2 and max(arities) == SPEC.max_args
    assert set(labels) == set(range(10))  # every value occurs
    assert {e[0] for e in expressions} == {10, 11, 12, 13}  # every operator at the root


def test_batches_are_padded_with_pad_and_the_mask_marks_exactly_the_padding():
    b = SPEC.batch(50, torch.Generator().manual_seed(2))
    assert b.tokens.shape == (50, int(b.lengths.max())) and b.tokens.dtype == torch.long
    positions = torch.arange(b.tokens.shape[1])
    assert torch.equal(b.padding, positions[None] >= b.lengths[:, None])
    assert (b.tokens[b.padding] == PAD).all() and (b.tokens[~b.padding] != PAD).all()
    for i in range(50):
        assert listops.evaluate(b.tokens[i]) == b.target[i].item()
        assert listops.depth(b.tokens[i]) == b.depths[i].item()
    fixed = SPEC.batch(8, torch.Generator().manual_seed(2), length=64)
    assert fixed.tokens.shape == (8, 64)
    assert torch.equal(fixed.tokens[:, : b.tokens.shape[1]], b.tokens[:8])  # the same expressions, more PAD


def test_a_seed_fixes_the_batch_and_different_seeds_differ():
    a = SPEC.batch(32, torch.Generator().manual_seed(5))
    b = SPEC.batch(32, torch.Generator().manual_seed(5))
    c = SPEC.batch(32, torch.Generator().manual_seed(6))
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.target, b.target)
    assert a.tokens.shape != c.tokens.shape or not torch.equal(a.tokens, c.tokens)
    g = torch.Generator().manual_seed(5)
    first, second = SPEC.batch(32, g), SPEC.batch(32, g)  # the generator advances
    assert torch.equal(first.tokens, a.tokens) and not torch.equal(second.tokens[:, :10], first.tokens[:, :10])


def test_label_distribution_gives_shares_and_the_majority_rate():
    shares = listops.label_distribution([3, 3, 3, 1])
    assert shares.dtype == torch.float64 and shares.shape == (10,)
    assert shares[3] == 0.75 and shares[1] == 0.25 and shares.sum() == 1.0
    _, labels = SPEC.sample(2000, torch.Generator().manual_seed(3))
    dist = listops.label_distribution(torch.tensor(labels))
    assert 0.1 <= dist.max() < 0.5  # the majority class: at least uniform, far from a constant answer


def test_a_configuration_no_expression_can_meet_is_refused():
    with pytest.raises(ValueError, match=r"^ListOps: max_depth must be an int >= 1, got 0$"):
        ListOps(max_depth=0)
    with pytest.raises(
        ValueError, match=r"^ListOps: min_length must be an int >= 4 \(the shortest \[OP d d \]\), got 3"
    ):
        ListOps(min_length=3)
    with pytest.raises(ValueError, match=r"^ListOps: max_length must be an int >= 20 \(min_length\), got 10$"):
        ListOps(min_length=20, max_length=10)
    with pytest.raises(ValueError, match=r"min_length must be an int <= 4 \(the longest expression of depth 1 with 2"):
        ListOps(max_depth=1, max_args=2, min_length=5, max_length=8)
    with pytest.raises(ValueError, match=r"^ListOps: leaf_probability must be a finite number > 0 and < 1, got 1.0$"):
        ListOps(leaf_probability=1.0)
    with pytest.raises(TypeError, match=r"^ListOps: max_args must be an int, got 4.0$"):
        ListOps(max_args=4.0)
    with pytest.raises(TypeError, match=r"^ListOps.sample: generator must be a torch.Generator"):
        SPEC.sample(3, 0)
    with pytest.raises(ValueError, match=r"^ListOps.batch: length must be an int >= 40 \(max_length\), got 12$"):
        SPEC.batch(3, torch.Generator(), length=12)


def test_malformed_expressions_are_reported_not_evaluated():
    ids = [listops.VOCAB.index(w) for w in "[MAX 1 2".split()]
    with pytest.raises(
        ValueError, match=r"^listops.evaluate: tokens must close every operator with '\]', got '\[MAX 1 2'$"
    ):
        listops.evaluate(ids)
    with pytest.raises(
        ValueError, match=r"tokens must close with every '\]' an operator that has arguments, got '\[MAX \]'"
    ):
        listops.evaluate([listops.MAX_ID, listops.CLOSE])
    with pytest.raises(ValueError, match=r"tokens must hold one expression \(nothing after its last '\]'\)"):
        listops.evaluate([listops.MIN_ID, 1, 2, listops.CLOSE, 3])
    with pytest.raises(ValueError, match=r"tokens must have every digit inside an operator, got '4 5'"):
        listops.evaluate([4, 5])
    assert listops.evaluate([7]) == 7  # a lone digit is its own value
    with pytest.raises(ValueError, match=r"^label_distribution: labels must hold at least 1 label, got 0 labels$"):
        listops.label_distribution(torch.tensor([], dtype=torch.long))
    with pytest.raises(ValueError, match=r"^label_distribution: every label must be an int in 0..9, got 10$"):
        listops.label_distribution([0, 10])
