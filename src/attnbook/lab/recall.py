"""Multi-query associative recall: how many key-value pairs each mechanism's state can hold (chapter 8).

The task is multi-query associative recall (MQAR) of Zoology (Arora et al., "Zoology: Measuring and Improving
Recall in Efficient Language Models", 2023): a sequence writes P key-value pairs, then asks for keys, and the
model must answer each query with the value written under it::

    (k_1, v_1) (k_2, v_2) ... (k_P, v_P)   q_1 q_2 ... q_Q        q_j = k_i for some i;  target at q_j: v_i

Here every key is asked once, in a random order (Q = P). Zoology's definition differs in three ways, each
for a reason:

* a pair is one token (the fact (k, v), embedded as key[k] + value[v], :class:`~attnbook.lab.headtohead.
  RecallEmbedding`), as in chapter 6's task, where Zoology writes the key and the value as two tokens: the
  two-token format did not train on a CPU within a few hundred steps;
* the queries are not followed by their answers: the model answers at each query position, and the next query
  follows. Nothing after a query reveals its answer, so a mechanism without a causal form (Mobile-Attention)
  can read the whole sequence without seeing what it must predict;
* small vocabularies (128 keys, 64 values) and short sequences (2P tokens), so that a sweep fits on a CPU.

:func:`train` trains one model (a :class:`~attnbook.lab.training.Classifier` of causal blocks, read at every
position) and returns its held-out accuracy over the queries against the steps (a
:class:`~attnbook.lab.headtohead.Curve`). :func:`study` trains every mechanism at every number of pairs and
width, each at the best of a learning-rate sweep (by final accuracy, seed 0), then with more seeds at that
rate; it records the steps to 90 % beside the final accuracy, so that learning slowly and being unable to hold
the pairs are told apart. :func:`state_numbers` counts what each mechanism carries per layer after the whole
sequence, the quantity the recall is limited by; :func:`table` and :func:`plot` show a study.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import ExitStack
from dataclasses import asdict, dataclass, replace

import torch
from torch import nn

from .. import mechanisms
from .._checks import check_device, check_instance, check_int, check_number
from ..lm import state_bytes
from . import training
from .headtohead import Curve, RecallEmbedding, RecallTask

__all__ = ["MultiQueryRecall", "MECHANISMS", "train", "study", "state_numbers", "costs", "numbers", "table", "plot"]

#: The mechanisms of the study: every one of the registry (Mobile-Attention non-causally, it has no causal form)
#: and the blocks without attention.
MECHANISMS = (*mechanisms.names(), training.NO_ATTENTION)


@dataclass(frozen=True)
class MultiQueryRecall(RecallTask):
    """P key-value facts, then every key once as a query, in a random order; targets: their values.

    Tokens as in :class:`~attnbook.lab.headtohead.RecallTask`: ``k * n_values + v`` for a fact, ``n_keys *
    n_values + k`` for a query of key k. Chance accuracy is ``1 / n_values``.
    """

    n_pairs: int = 16
    n_keys: int = 128
    n_values: int = 64

    @property
    def length(self) -> int:
        """P facts and P queries."""
        return 2 * self.n_pairs

    def batch(self, size: int, generator: torch.Generator, device: torch.device | str = "cpu"):
        """``(tokens (size, 2P) long, targets (size, P) long in [0, n_values))``: the values asked for, in order."""
        size = check_int(size, "size", name="MultiQueryRecall.batch", minimum=1)
        what = "a torch.Generator (None would draw from the global generator: not reproducible)"
        check_instance(generator, "generator", torch.Generator, name="MultiQueryRecall.batch", what=what)
        P = self.n_pairs
        keys = torch.rand(size, self.n_keys, generator=generator).argsort(dim=-1)[:, :P]  # (size, P) distinct
        values = torch.randint(self.n_values, (size, P), generator=generator)  # (size, P)
        order = torch.rand(size, P, generator=generator).argsort(dim=-1)  # (size, P): which fact each query asks
        queries = self.n_keys * self.n_values + keys.gather(1, order)  # (size, P)
        tokens = torch.cat([keys * self.n_values + values, queries], dim=1)  # (size, 2P)
        return tokens.to(device), values.gather(1, order).to(device)


def _causal(mechanism: str) -> bool:
    """Causal blocks for every mechanism with a causal form (Mobile-Attention has none; it reads the whole
    sequence, which holds no answer); the no-attention baseline has no mixing to make causal."""
    return mechanism != training.NO_ATTENTION and mechanisms.get(mechanism).causal


def model(mechanism: str, task: MultiQueryRecall, width: int, n_heads: int = 4, n_layers: int = 2) -> nn.Module:
    """The study's model: factored embeddings, ``n_layers`` blocks of ``mechanism``, a value head at every position."""
    return training.Classifier(
        mechanism, vocab=task.vocab, length=task.length, n_classes=task.n_values, d_model=width, n_heads=n_heads,
        n_layers=n_layers, pool="all", causal=_causal(mechanism), embedding=RecallEmbedding(task, width),
    )  # fmt: skip


def train(
    mechanism: str,
    task: MultiQueryRecall,
    *,
    width: int = 64,
    lr: float = 3e-3,
    steps: int = 600,
    batch: int = 64,
    seed: int = 0,
    eval_every: int = 25,
    eval_size: int = 256,
    device: torch.device | str = "cpu",
) -> Curve:
    """Train :func:`model` on ``task`` (AdamW, warm-up then cosine) on ``device``; held-out accuracy over all
    queries. The data are drawn on the CPU (the same sequences on every device)."""
    name = "recall.train"
    if mechanism not in MECHANISMS:
        mechanisms.get(mechanism)  # raises, naming the registry's mechanisms
    # chapter 6's single-query RecallTask trained to a meaningless curve (its targets broadcast against these)
    check_instance(task, "task", MultiQueryRecall, name=name, what="a MultiQueryRecall")
    seed = check_int(seed, "seed", name=name, minimum=0)
    device = check_device(device, name=name) or torch.device("cpu")
    lr = check_number(lr, "lr", name=name, minimum=0.0, strict_minimum=True)
    steps = check_int(steps, "steps", name=name, minimum=1)
    torch.manual_seed(seed)
    net = model(mechanism, task, width).to(device)
    data = torch.Generator().manual_seed(seed + 1)
    held_tokens, held_targets = task.batch(eval_size, torch.Generator().manual_seed(10_000 + seed), device)
    curve = Curve(mechanism, seed=seed)
    P = task.n_pairs

    # the answers at the queries, (eval_size, P, n_values); no early stop
    evaluate = training.held_out_evaluation(net, curve, lambda: net(held_tokens)[:, P:], held_targets)

    def loss(net: nn.Module, b: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return nn.functional.cross_entropy(net(b[0])[:, P:].flatten(0, 1), b[1].flatten())

    optim = training.Optim(lr, 0.01, warmup=steps // 10, clip=1.0)
    training.fit(net, lambda _: task.batch(batch, data, device), loss, steps=steps, optim=optim, evaluate=evaluate,
                 eval_every=eval_every, device=device)  # fmt: skip
    return curve


def state_numbers(mechanism: str, width: int, length: int, n_heads: int = 4) -> int | None:
    """The numbers one layer carries after ``length`` tokens when it generates: its KV cache or its recurrent state
    (counted by running the layer). None for a mechanism without a causal form or without attention."""
    if not _causal(mechanism):
        return None
    layer = mechanisms.get(mechanism).module(width, n_heads, causal=True)
    with torch.no_grad():
        _, state = layer(torch.randn(1, length, width), output_final_state=True)
    return state_bytes(state) // 4  # float32 numbers


def costs(
    names: Sequence[str], *, width: int = 64, n_heads: int = 4, tokens: int = 1024, repeats: int = 5,
    device: torch.device | str = "cpu",
) -> dict:  # fmt: skip
    """What each causal mechanism's layer costs, at ``width`` with ``n_heads`` heads, one sequence of ``tokens``:
    ``state`` the numbers it carries after the sequence (:func:`state_numbers`), ``step_s`` the median time of one
    token's step after that prefix, ``train_s`` of one forward and backward over the sequence; timed alternating
    between the mechanisms (:func:`attnbook.lab.profiling.compare`) on ``device``. Returns ``{name: {...}}``."""
    from .profiling import compare

    device = torch.device(device)
    x = torch.randn(1, tokens, width, generator=torch.Generator().manual_seed(0)).to(device)
    layers, states, calls = {}, {}, {}
    for name in names:
        torch.manual_seed(0)
        layers[name] = layer = mechanisms.get(name).module(width, n_heads, causal=True).to(device)
        with torch.no_grad():
            states[name] = layer(x, output_final_state=True)[1]

        def step(layer=layer, state=states[name]) -> None:
            with torch.no_grad():
                layer.step(x[:, -1], state)

        def train(layer=layer) -> None:
            layer(x).sum().backward()

        calls[f"{name} step"], calls[f"{name} train"] = step, train
    timed = compare(calls, repeats=repeats, warmup=1, device=device)
    return {
        name: {"state": state_bytes(states[name]) // 4, "step_s": timed[f"{name} step"].median,
               "train_s": timed[f"{name} train"].median}
        for name in names
    }  # fmt: skip


@dataclass(frozen=True)
class _Job:
    mechanism: str
    n_pairs: int
    width: int
    lr: float
    seed: int
    steps: int


def _run(job: _Job) -> dict:
    torch.set_num_threads(1)
    curve = train(job.mechanism, MultiQueryRecall(n_pairs=job.n_pairs), width=job.width, lr=job.lr, steps=job.steps,
                  seed=job.seed)  # fmt: skip
    return {**asdict(job), "steps_eval": curve.steps, "accuracy": curve.accuracy, "loss": curve.loss,
            "final": curve.final_accuracy, "steps_to_90": curve.steps_to(0.9), "train_s": curve.wall_s[-1]}  # fmt: skip


def _map(jobs: list[_Job], workers: int, progress: Callable[[dict], None] | None) -> list[dict]:
    with ExitStack() as stack:  # in this process with one worker, else in a pool of them
        mapped = map(_run, jobs) if workers == 1 else stack.enter_context(ProcessPoolExecutor(workers)).map(_run, jobs)
        results = []
        for r in mapped:
            results.append(r)
            if progress:
                progress(r)
        return results


def study(
    mechanism_names: Sequence[str] = MECHANISMS,
    *,
    pairs: Sequence[int] = (8, 32, 64),
    widths: Sequence[int] = (32, 64),
    lrs: Sequence[float] = (1e-3, 3e-3, 1e-2),
    seeds: int = 3,
    steps: int = 600,
    workers: int = 1,
    progress: Callable[[dict], None] | None = None,
) -> dict:
    """Every mechanism at every number of pairs and width: a learning-rate sweep with seed 0, then seeds 1 ..
    ``seeds - 1`` at the best rate (the highest final accuracy; the fewer steps to 90 % on a tie). Returns a plain
    dict: ``config``, ``runs`` (every run with its curve) and ``results`` (per mechanism, pairs and width: the
    chosen rate, the final accuracies and steps to 90 % of the seeds, their mean, and the state's numbers)."""
    check_int(seeds, "seeds", name="recall.study", minimum=1)
    settings = [(m, p, w) for m in mechanism_names for p in pairs for w in widths]
    sweep = _map([_Job(m, p, w, lr, 0, steps) for m, p, w in settings for lr in lrs], workers, progress)
    best = {}
    for m, p, w in settings:
        tried = [r for r in sweep if (r["mechanism"], r["n_pairs"], r["width"]) == (m, p, w)]
        best[m, p, w] = max(tried, key=lambda r: (r["final"], -(r["steps_to_90"] or steps + 1)))
    more = [replace(_Job(m, p, w, best[m, p, w]["lr"], 0, steps), seed=s) for m, p, w in settings
            for s in range(1, seeds)]  # fmt: skip
    runs = sweep + _map(more, workers, progress)
    results = []
    for m, p, w in settings:
        lr = best[m, p, w]["lr"]
        chosen = [r for r in runs if (r["mechanism"], r["n_pairs"], r["width"], r["lr"]) == (m, p, w, lr)]
        chosen.sort(key=lambda r: r["seed"])
        finals = [r["final"] for r in chosen]
        results.append({
            "mechanism": m, "n_pairs": p, "width": w, "lr": lr, "seeds": [r["seed"] for r in chosen],
            "final": finals, "mean": statistics.fmean(finals), "steps_to_90": [r["steps_to_90"] for r in chosen],
            "state_numbers": state_numbers(m, w, 2 * p),
        })  # fmt: skip
    config = {"mechanisms": list(mechanism_names), "pairs": list(pairs), "widths": list(widths), "lrs": list(lrs),
              "seeds": seeds, "steps": steps, "batch": 64, "eval_size": 256, "n_heads": 4, "n_layers": 2,
              "task": asdict(MultiQueryRecall())}  # fmt: skip
    return {"kind": "attnbook.lab.recall", "config": config, "runs": runs, "results": results}


def _result(recording: dict, mechanism: str, n_pairs: int, width: int) -> dict:
    return next(r for r in recording["results"] if (r["mechanism"], r["n_pairs"], r["width"]) == (mechanism,
                n_pairs, width))  # fmt: skip


def numbers(recording: dict) -> dict[str, float]:
    """A study's numbers for chapter 6's table "which mechanism when" (beside
    :func:`attnbook.lab.headtohead.claim_numbers`): ``"recall pairs"`` the most pairs studied, ``"recall
    {mechanism} {width}"`` each mechanism's mean final accuracy there at each width, and ``"... low"`` and
    ``"... high"`` its lowest and highest seed."""
    c = recording["config"]
    most = max(c["pairs"])
    out = {"recall pairs": float(most)}
    for m in c["mechanisms"]:
        for w in c["widths"]:
            r = _result(recording, m, most, w)
            key = f"recall {m} {w}"
            out[key], out[f"{key} low"], out[f"{key} high"] = r["mean"], min(r["final"]), max(r["final"])
    return out


def table(recording: dict, width: int) -> str:
    """Mean final accuracy over the seeds (their range in brackets where a seed is below 0.995) against the number
    of pairs, for one width, and the numbers one layer holds at the largest (``state``): a text table of at most
    70 columns with three numbers of pairs (17 more per number)."""
    c = recording["config"]
    # each cell: the mean right-aligned under its header, then the range or blanks, so that no two cells touch
    head = (
        f"{'width ' + str(width):9s}" + "".join(f"{'P=' + str(p):>5s}{'':12s}" for p in c["pairs"]) + f"{'state':>9s}"
    )
    lines = [head]
    for m in c["mechanisms"]:
        cells = []
        for p in c["pairs"]:
            r = _result(recording, m, p, width)
            spread = "" if min(r["final"]) >= 0.995 else f"({min(r['final']):.2f}-{max(r['final']):.2f})"
            cells.append(f"{r['mean']:5.2f} {spread:11s}")
        state = _result(recording, m, c["pairs"][-1], width)["state_numbers"]
        lines.append(f"{m:9s}" + "".join(cells) + (f"{state:>9d}" if state is not None else f"{'-':>9s}"))
    return "\n".join(lines)


def plot(recording: dict, *, title: str | None = None):
    """Mean final accuracy against the number of pairs, one panel per width, one line per mechanism (the seeds'
    range shaded); chance is the dotted line."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    from ..viz.style import PAGE_WIDTH, book_style, line_style

    c = recording["config"]
    with book_style():
        fig, axes = plt.subplots(1, len(c["widths"]), figsize=(PAGE_WIDTH, 3.4), sharey=True, layout="constrained")
        axes_list = list(getattr(axes, "flat", [axes]))
        for ax, w in zip(axes_list, c["widths"], strict=True):
            for m in c["mechanisms"]:
                rs = [_result(recording, m, p, w) for p in c["pairs"]]
                style = {**line_style(m), **({"linestyle": ":"} if m == training.NO_ATTENTION else {})}
                ax.plot(c["pairs"], [r["mean"] for r in rs], marker="o", ms=3, label=m, **style)
                ax.fill_between(c["pairs"], [min(r["final"]) for r in rs], [max(r["final"]) for r in rs],
                                color=style["color"], alpha=0.12, lw=0)  # fmt: skip
            ax.axhline(1 / c["task"]["n_values"], color="0.5", lw=0.8, ls=":")
            ax.set(xscale="log", xticks=c["pairs"], xticklabels=[str(p) for p in c["pairs"]], title=f"width {w}",
                   xlabel="key-value pairs P")  # fmt: skip
            ax.xaxis.set_minor_formatter(NullFormatter())  # only the numbers of pairs studied
        axes_list[0].set_ylabel("held-out recall accuracy")
        axes_list[-1].legend(loc="lower left", ncol=2)
        if title:
            fig.suptitle(title)
    return fig
