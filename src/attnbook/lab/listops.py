"""ListOps: nested list operations on the digits 0-9, a classification task of hierarchical structure.

ListOps (Nangia & Bowman 2018) is one of the tasks of Long Range Arena (Tay et al. 2021), on which Flowformer
(Wu et al., ICML 2022) reports its ListOps numbers. An expression is a tree of operators over digits,

    [MAX 2 9 [MIN 4 7 ] 0 ]        = 9
    [SM [MED 1 5 3 ] 8 ]           = (3 + 8) mod 10 = 1

and its label is its value, one of 10 classes. The operators:

* ``[MAX``, ``[MIN``: the largest, the smallest argument;
* ``[MED``: the median of the arguments; for an even number of them, the floor of the mean of the two middle
  ones (what ``int(numpy.median(...))`` gives), so the value is a digit again;
* ``[SM``: the sum of the arguments modulo 10.

``]`` closes an operator. This generator is written from that description alone (not from LRA's code):

* the root is an operator, so every expression has depth >= 1 (depth = the most operators nested in one
  another: ``[MAX 1 2 ]`` has depth 1);
* an operator at depth d takes 2 to ``max_args`` arguments (uniformly), each an operator with
  probability ``1 - leaf_probability`` (a digit otherwise) while d < ``max_depth``, and a digit at the depth
  bound;
* expressions whose length (in tokens) falls outside ``min_length .. max_length`` are drawn again (rejection),
  so lengths are bounded exactly.

Tokens are ints (:data:`VOCAB` lists them by id): the digit d is id d, the operators 10-13, ``]`` 14, and
:data:`PAD` = 15 fills a batch to a common length. Randomness comes from a ``torch.Generator``: one 63-bit
seed is drawn from it per call and drives Python's ``random.Random`` (a tree is many small branching
decisions, which plain Python does in microseconds), so a generator in a given state always gives the same
batch.

* :class:`ListOps` -- the configuration; :meth:`ListOps.sample` (expressions as token lists and labels),
  :meth:`ListOps.batch` (padded tensors);
* :func:`evaluate`, :func:`depth`, :func:`to_text` -- read a token list back;
* :func:`label_distribution` -- the share of every label, for chance levels (1/10 and the majority class).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .._checks import check_count, check_found, check_instance, check_int, check_number, check_sequence, check_tensor

__all__ = [
    "VOCAB",
    "OPERATORS",
    "CLOSE",
    "PAD",
    "N_CLASSES",
    "ListOps",
    "ListOpsBatch",
    "evaluate",
    "depth",
    "to_text",
    "label_distribution",
]

#: The four operators' opening tokens: maximum, minimum, median, sum modulo 10.
OPERATORS = ("[MAX", "[MIN", "[MED", "[SM")
#: Every token: the digits 0-9 (ids 0-9), the operators (10-13), the closing bracket and padding.
VOCAB: tuple[str, ...] = tuple(str(d) for d in range(10)) + OPERATORS + ("]", "<pad>")
MAX_ID, MIN_ID, MED_ID, SM_ID = 10, 11, 12, 13
#: The id of the closing bracket "]".
CLOSE = 14
#: The id of the padding token.
PAD = 15
#: The number of classes: a list's value is a digit.
N_CLASSES = 10
_SHORTEST = 4  # [OP d d ]
_MAX_TRIES = 10_000


def _apply(op: int, args: list[int]) -> int:
    if op == MAX_ID:
        return max(args)
    if op == MIN_ID:
        return min(args)
    if op == MED_ID:
        s = sorted(args)
        n = len(s)
        return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) // 2
    return sum(args) % 10  # SM_ID


def _longest(max_depth: int, max_args: int) -> int:
    """The longest expression of depth <= max_depth: L(1) = 2 + max_args, L(d) = 2 + max_args L(d - 1)."""
    length = 1
    for _ in range(max_depth):
        length = 2 + max_args * length
    return length


@dataclass(frozen=True)
class ListOpsBatch:
    """Padded expressions: ``tokens`` (B, N) long, ``target`` (B,) long in 0..9, ``padding`` (B, N) bool
    (True = a PAD position, the convention of ``key_padding_mask`` in ``nn.MultiheadAttention``),
    ``lengths`` (B,) long and ``depths`` (B,) long."""

    tokens: torch.Tensor
    target: torch.Tensor
    padding: torch.Tensor
    lengths: torch.Tensor
    depths: torch.Tensor


@dataclass(frozen=True)
class ListOps:
    """The ListOps generator: nested MAX, MIN, MED and SM over the digits 0-9 (module docstring).

    Args:
        max_depth: the most operators nested in one another (>= 1).
        max_args: the most arguments of one operator (>= 2; every operator takes 2 to ``max_args``).
        min_length, max_length: the bounds of an expression's length in tokens, brackets included (>= 4,
            the shortest expression ``[OP d d ]``).
        leaf_probability: the chance that an argument below the depth bound is a digit rather than an
            operator, in (0, 1).
    """

    max_depth: int = 3
    max_args: int = 4
    min_length: int = 8
    max_length: int = 48
    leaf_probability: float = 0.5

    def __post_init__(self):
        name = "ListOps"
        check_int(self.max_depth, "max_depth", name=name, minimum=1)
        check_int(self.max_args, "max_args", name=name, minimum=2)
        check_int(self.min_length, "min_length", name=name, minimum=_SHORTEST, why=" (the shortest [OP d d ])")
        check_int(self.max_length, "max_length", name=name, minimum=self.min_length, why=" (min_length)")
        longest = _longest(self.max_depth, self.max_args)
        why = f" (the longest expression of depth {self.max_depth} with {self.max_args} arguments)"
        check_int(self.min_length, "min_length", name=name, maximum=longest, why=why)
        check_number(self.leaf_probability, "leaf_probability", name=name, minimum=0.0, maximum=1.0,
                     strict_minimum=True, strict_maximum=True)  # fmt: skip

    @property
    def vocab(self) -> int:
        """Token ids 0 .. 15: digits, operators, ``]``, PAD."""
        return len(VOCAB)

    @property
    def n_classes(self) -> int:
        return N_CLASSES

    @property
    def chance(self) -> float:
        """Guessing one of the 10 values: 0.1 (see :func:`label_distribution` for the majority class)."""
        return 1.0 / N_CLASSES

    def _tree(self, rng: random.Random, level: int, budget: int) -> tuple[list[int], int] | None:
        """Tokens and value of an operator at depth ``level`` (1 = the root), or None past ``budget`` tokens."""
        op = MAX_ID + rng.randrange(4)
        tokens, values = [op], []
        for _ in range(rng.randint(2, self.max_args)):
            if level < self.max_depth and rng.random() >= self.leaf_probability:
                sub = self._tree(rng, level + 1, budget - len(tokens) - 1)
                if sub is None:
                    return None
                tokens.extend(sub[0])
                values.append(sub[1])
            else:
                digit = rng.randrange(10)
                tokens.append(digit)
                values.append(digit)
            if len(tokens) + 1 > budget:
                return None
        tokens.append(CLOSE)
        return tokens, _apply(op, values)

    def sample(self, n: int, generator: torch.Generator) -> tuple[list[list[int]], list[int]]:
        """``n`` expressions as token-id lists and their values (labels), lengths within the bounds.

        Deterministic: the generator in a given state gives the same expressions (one seed is drawn from it).
        """
        name = "ListOps.sample"
        n = check_int(n, "n", name=name, minimum=1)
        check_instance(generator, "generator", torch.Generator, name=name, what="a torch.Generator")
        rng = random.Random(int(torch.randint(2**62, (1,), generator=generator)))
        expressions, labels = [], []
        expected = f"produce expressions of {self.min_length} to {self.max_length} tokens (lower leaf_probability, "
        expected += "or raise max_args or max_depth)"
        got = f"none in {_MAX_TRIES} draws with {self}"
        for _ in range(n):
            trees = (self._tree(rng, 1, self.max_length) for _ in range(_MAX_TRIES))
            tree = next((t for t in trees if t is not None and len(t[0]) >= self.min_length), None)
            check_found([tree] if tree else [], "the configuration", name=name, expected=expected, got=got)
            expressions.append(tree[0])
            labels.append(tree[1])
        return expressions, labels

    def batch(
        self, size: int, generator: torch.Generator, device: torch.device | str = "cpu", *, length: int | None = None
    ) -> ListOpsBatch:
        """``size`` expressions padded with :data:`PAD` to ``length`` (default: the longest of the batch).

        A fixed ``length`` (e.g. ``max_length``) gives every batch one shape.
        """
        name = "ListOps.batch"
        size = check_int(size, "size", name=name, minimum=1)
        if length is not None:
            check_int(length, "length", name=name, minimum=self.max_length, why=" (max_length)")
        expressions, labels = self.sample(size, generator)
        n = length or max(len(e) for e in expressions)
        tokens = torch.full((size, n), PAD, dtype=torch.long)
        for b, e in enumerate(expressions):
            tokens[b, : len(e)] = torch.tensor(e, dtype=torch.long)
        return ListOpsBatch(
            tokens=tokens.to(device),
            target=torch.tensor(labels, dtype=torch.long, device=device),
            padding=(tokens == PAD).to(device),
            lengths=torch.tensor([len(e) for e in expressions], dtype=torch.long).to(device),
            depths=torch.tensor([depth(e) for e in expressions], dtype=torch.long).to(device),
        )


def _ids(tokens, name: str) -> list[int]:
    if isinstance(tokens, torch.Tensor):
        check_tensor(tokens, "tokens", name=name, dims=1, layout="(N,)", floating=False)
        tokens = tokens.tolist()
    check_sequence(tokens, "tokens", name=name, minimum=1, item="token")
    ids = [t for t in tokens if t != PAD]
    for t in ids:
        check_int(t, "every token", name=name, minimum=0, maximum=PAD)
    return ids


def _require(ok: bool, ids: list[int], expected: str) -> None:
    """A malformed expression: ``ValueError`` through the validation module, quoting the expression."""
    check_found([ids] if ok else [], "tokens", name="listops.evaluate", expected=expected, got=repr(to_text(ids)))


def evaluate(tokens: Sequence[int] | torch.Tensor) -> int:
    """The value of one expression (token ids, PAD ignored); ``ValueError`` if it is not well formed."""
    name = "listops.evaluate"
    ids = _ids(tokens, name)
    stack: list[tuple[int, list[int]]] = []
    result = None
    for t in ids:
        _require(result is None, ids, "hold one expression (nothing after its last ']')")
        if MAX_ID <= t <= SM_ID:
            stack.append((t, []))
        elif t == CLOSE:
            _require(bool(stack and stack[-1][1]), ids, "close with every ']' an operator that has arguments")
            op, args = stack.pop()
            value = _apply(op, args)
            if stack:
                stack[-1][1].append(value)
            else:
                result = value
        else:  # a digit
            if not stack and len(ids) == 1:
                return t
            _require(bool(stack), ids, "have every digit inside an operator")
            stack[-1][1].append(t)
    _require(result is not None, ids, "close every operator with ']'")
    return result


def depth(tokens: Sequence[int] | torch.Tensor) -> int:
    """The most operators nested in one another (``[MAX 1 2 ]``: 1; a lone digit: 0)."""
    level = deepest = 0
    for t in _ids(tokens, "listops.depth"):
        if MAX_ID <= t <= SM_ID:
            level += 1
            deepest = max(deepest, level)
        elif t == CLOSE:
            level -= 1
    return deepest


def to_text(tokens: Sequence[int] | torch.Tensor) -> str:
    """The expression as text, ``"[MAX 2 9 ]"`` (PAD dropped)."""
    ids = tokens.tolist() if isinstance(tokens, torch.Tensor) else list(tokens)
    return " ".join(VOCAB[t] for t in ids if t != PAD)


def label_distribution(labels: torch.Tensor | Sequence[int]) -> torch.Tensor:
    """The share of every class 0..9 among ``labels``: (10,) float64, summing to 1.

    ``.max()`` is the majority-class rate, the accuracy of always answering the commonest value: the chance
    level to beat besides 1/10 (ListOps' labels are far from uniform: MAX leans to 9, MIN to 0).
    """
    name = "label_distribution"
    if not isinstance(labels, torch.Tensor):
        check_sequence(labels, "labels", name=name, minimum=1, item="label")
        labels = torch.tensor(list(labels), dtype=torch.long)
    check_tensor(labels, "labels", name=name, dims=1, layout="(B,)", floating=False)
    check_count(labels, "labels", name=name, minimum=1, item="label")
    check_int(int(labels.min()), "every label", name=name, minimum=0, maximum=N_CLASSES - 1)
    check_int(int(labels.max()), "every label", name=name, minimum=0, maximum=N_CLASSES - 1)
    counts = torch.bincount(labels.cpu(), minlength=N_CLASSES).to(torch.float64)
    return counts / counts.sum()
