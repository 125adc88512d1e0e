"""Training the language model of chapter 7 on real text and measuring it in bits per byte.

Every mechanism is trained the same way: the same :class:`Setup` (width, depth, context, batch, steps,
learning-rate schedule), the same training windows for a given seed, the same fixed validation windows.
Quality is reported in **bits per byte**, the average number of bits the model needs to encode each next byte
of held-out text, ``-log2 p(x_{t+1} | x_{<=t})`` averaged over positions: 8 for a uniform guess over 256 byte
values, lower the better the model predicts.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .. import config
from .._checks import check_count, check_instance, check_int
from ..lm import DecoderLM
from .corpus import Corpus, windows
from .progress import Progress
from .training import Optim, fit

__all__ = [
    "Setup",
    "SMALL",
    "FULL",
    "RECORDED",
    "setup",
    "Run",
    "learning_rate",
    "validation_starts",
    "bits_per_byte",
    "ngram_bits_per_byte",
    "train",
    "race",
    "spread",
    "step_seconds",
    "distinct_fraction",
    "final_bpb",
    "bpb_table",
    "recording_header",
    "quality_cost_table",
]

LN2 = math.log(2.0)


@dataclass(frozen=True)
class Setup:
    """Sizes and schedule shared by every mechanism of a comparison.

    Attributes:
        dim, n_heads, n_layers: the model (:class:`attnbook.lm.DecoderLM`).
        context: training window length N (bytes).
        batch: windows per training step.
        steps: training steps.
        lr: peak learning rate of AdamW; ``warmup`` linear steps up to it, then a cosine down to ``lr / 10``.
        weight_decay: AdamW's decoupled weight decay.
        eval_every: steps between two validation measurements (and one at the end).
        eval_windows: number of fixed validation windows of ``context`` bytes.
    """

    dim: int = 32
    n_heads: int = 4
    n_layers: int = 2
    context: int = 64
    batch: int = 8
    steps: int = 100
    lr: float = 2e-2
    warmup: int = 10
    weight_decay: float = 0.01
    eval_every: int = 10
    eval_windows: int = 16

    def model(self, mechanism: str) -> DecoderLM:
        return DecoderLM(mechanism, dim=self.dim, n_heads=self.n_heads, n_layers=self.n_layers)


SMALL = Setup()  # CI: every mechanism x 3 seeds in about 25 s of one CPU core
FULL = Setup(
    dim=128, n_heads=4, n_layers=2, context=128, batch=32, steps=300, lr=3e-3, warmup=30, eval_every=50,
    eval_windows=64,
)  # fmt: skip


# Recorded by benchmarks/bench_lm_training.py on a CPU (and timed by bench_generation.py): larger than the CI
# size, small enough for one CPU core in about an hour.
RECORDED = Setup(
    dim=128, n_heads=4, n_layers=2, context=128, batch=16, steps=600, lr=3e-3, warmup=50, eval_every=50,
    eval_windows=64,
)  # fmt: skip


def setup() -> Setup:
    """:data:`SMALL` on a CPU / in CI, :data:`FULL` on a GPU (:func:`attnbook.config.pick`)."""
    return config.pick(small=SMALL, full=FULL)


def learning_rate(step: int, s: Setup) -> float:
    """The schedule every mechanism follows: linear warm-up to ``s.lr``, cosine decay to ``s.lr / 10``."""
    return Optim(s.lr, s.weight_decay, warmup=s.warmup).learning_rate(step, s.steps)


def validation_starts(data: torch.Tensor, n: int, length: int) -> torch.Tensor:
    """``n`` fixed window starts spread evenly over ``data`` (no randomness: every run sees the same)."""
    n = check_int(n, "n", name="validation_starts", minimum=1)
    check_count(data, "data", name="validation_starts", minimum=length + 1, item="byte", why=" (length + 1)")
    last = data.numel() - length - 1
    return torch.linspace(0, last, n).long()  # (n,)


@torch.no_grad()
def bits_per_byte(model: DecoderLM, data: torch.Tensor, starts: torch.Tensor, length: int, batch: int = 32) -> float:
    """Mean ``-log2 p(next byte)`` of ``model`` over the windows of ``data`` at ``starts`` (eval mode)."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(starts), batch):
        x, y = windows(data, starts[i : i + batch], length)
        logits = model(x.to(device))  # (b, N, V)
        total += F.cross_entropy(logits.flatten(0, 1).float(), y.to(device).flatten(), reduction="sum").item()
        count += y.numel()
    model.train(was_training)
    return total / count / LN2


def ngram_bits_per_byte(train: torch.Tensor, valid: torch.Tensor, order: int) -> float:
    """Bits per byte on ``valid`` of a byte n-gram model counted on ``train`` (``order`` 1 or 2), add-one smoothed.

    ``order=1``: p(x) from byte frequencies; ``order=2``: p(x_{t+1} | x_t) from pair counts. The baselines a
    model must beat to show that it uses more than the last byte.
    """
    order = check_int(order, "order", name="ngram_bits_per_byte", minimum=1, maximum=2)
    t, v = train.long(), valid.long()
    if order == 1:
        counts = torch.bincount(t, minlength=256).double() + 1  # (256,)
        logp = (counts / counts.sum()).log()
        return float(-logp[v].mean() / LN2)
    pairs = torch.bincount(t[:-1] * 256 + t[1:], minlength=256 * 256).double().view(256, 256) + 1
    logp = (pairs / pairs.sum(dim=1, keepdim=True)).log()  # (256, 256): row = previous byte
    return float(-logp[v[:-1], v[1:]].mean() / LN2)


@dataclass
class Run:
    """One training run: validation bits per byte against steps and training wall time, and the model.

    ``wall_s`` counts training steps only (validation excluded). ``train_bpb`` is the training loss of every
    step in bits per byte.
    """

    mechanism: str
    seed: int
    steps: list[int] = field(default_factory=list)
    wall_s: list[float] = field(default_factory=list)
    valid_bpb: list[float] = field(default_factory=list)
    train_bpb: list[float] = field(default_factory=list)
    model: DecoderLM | None = field(default=None, repr=False)

    @property
    def final_bpb(self) -> float:
        return self.valid_bpb[-1]

    @property
    def seconds(self) -> float:
        return self.wall_s[-1]


def train(
    mechanism: str,
    corpus: Corpus,
    s: Setup | None = None,
    *,
    seed: int = 0,
    device: torch.device | str = "cpu",
    progress: Progress | None = None,
    note: str = "",
) -> Run:
    """Train a :class:`~attnbook.lm.DecoderLM` with ``mechanism`` on ``corpus.train`` (AdamW, :func:`learning_rate`).

    The seed fixes the initial weights and the training windows, so every mechanism of one seed sees the same
    bytes in the same order. Validation uses the fixed windows of :func:`validation_starts`.
    """
    s = setup() if s is None else s
    device = torch.device(device)
    torch.manual_seed(seed)
    model = s.model(mechanism).to(device)
    data = torch.Generator().manual_seed(seed)
    valid_starts = validation_starts(corpus.valid, s.eval_windows, s.context)
    run = Run(mechanism, seed, model=model)
    high = corpus.train.numel() - s.context - 1

    def next_batch(_: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = windows(corpus.train, torch.randint(0, high, (s.batch,), generator=data), s.context)
        return x.to(device), y.to(device)

    def loss(model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(model(x).flatten(0, 1), y.flatten())  # logits (batch, N, V)

    def evaluate(step: int, elapsed: float) -> None:
        run.steps.append(step)
        run.wall_s.append(elapsed)
        run.valid_bpb.append(bits_per_byte(model, corpus.valid, valid_starts, s.context))

    def after_step(step: int, value: torch.Tensor) -> None:
        run.train_bpb.append(value.item() / LN2)  # .item() also waits for the device
        if progress is not None:
            progress.update(note=f"{note}bpb {run.valid_bpb[-1]:.2f}")

    optim = Optim(s.lr, s.weight_decay, warmup=s.warmup, clip=1.0, decay_matrices_only=True)
    fit(model, next_batch, loss, steps=s.steps, optim=optim, evaluate=evaluate, eval_every=s.eval_every,
        device=device, after_step=after_step)  # fmt: skip
    model.eval()
    return run


def race(
    mechanism_names: Sequence[str],
    corpus: Corpus,
    s: Setup | None = None,
    *,
    seeds: Sequence[int] = (0, 1, 2),
    device: torch.device | str = "cpu",
    progress: bool = True,
) -> dict[str, list[Run]]:
    """Train every mechanism with every seed (seed-major, so a partial run compares like with like)."""
    s = setup() if s is None else s
    check_count(mechanism_names, "mechanism_names", name="race", item="mechanism")
    check_count(seeds, "seeds", name="race", item="seed")
    bar = Progress(len(mechanism_names) * len(seeds) * s.steps, enabled=progress)
    runs: dict[str, list[Run]] = {m: [] for m in mechanism_names}
    for i, seed in enumerate(seeds):
        for m in mechanism_names:
            note = f"{m} seed {i + 1}/{len(seeds)}  "
            runs[m].append(train(m, corpus, s, seed=seed, device=device, progress=bar, note=note))
    bar.close()
    return runs


def step_seconds(
    mechanism_names: Sequence[str],
    corpus: Corpus,
    s: Setup | None = None,
    *,
    repeats: int = 15,
    device: torch.device | str = "cpu",
) -> dict[str, dict[str, float]]:
    """Seconds of one training step (forward, backward, AdamW) per mechanism, timed in one alternating run.

    Training runs made one after another on a shared machine see different loads; this times the same step
    of every mechanism alternately (:func:`attnbook.lab.profiling.compare`), so the ratios between them are
    fair. Returns ``{name: {"median": s, "min": s}}``.
    """
    from .profiling import compare

    s = setup() if s is None else s
    device = torch.device(device)
    starts = torch.randint(
        0, corpus.train.numel() - s.context - 1, (s.batch,), generator=torch.Generator().manual_seed(0)
    )
    x, y = (t.to(device) for t in windows(corpus.train, starts, s.context))
    steps = {}
    for name in mechanism_names:
        torch.manual_seed(0)
        model = s.model(name).to(device).train()
        opt = torch.optim.AdamW(model.parameters(), lr=s.lr)

        def one_step(model=model, opt=opt):
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            return loss.item()

        steps[name] = one_step
    timing = compare(steps, repeats=repeats, warmup=2, device=device)
    return {n: {"median": t.median, "min": min(t.samples)} for n, t in timing.items()}


def spread(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    values = list(values)
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def distinct_fraction(data: bytes, n: int = 4) -> float:
    """How varied a text is: the fraction of its n-byte windows that are distinct (1 = no window repeats).

    A text that loops on a short phrase scores near 0; random bytes score near 1.
    """
    check_instance(data, "data", (bytes, bytearray), name="distinct_fraction", what="bytes")
    n = check_int(n, "n", name="distinct_fraction", minimum=1)
    check_count(data, "data", name="distinct_fraction", minimum=n, item="byte", why=" (n)")
    grams = [bytes(data[i : i + n]) for i in range(len(data) - n + 1)]
    return len(set(grams)) / len(grams)


# -------------------------------------------------------------------------------------------------------------------
# Chapter 7's tables: a race (live Runs or a recording's dicts) summarised for an 80-column page.


def _last(runs, key: str) -> dict[str, list[float]]:
    """The last value of ``key`` of every run, by mechanism (in the order the runs come)."""
    if isinstance(runs, dict):
        runs = [r for group in runs.values() for r in group]
    out: dict[str, list[float]] = {}
    for r in runs:
        run = r if isinstance(r, dict) else vars(r)  # a recording's dict or a Run
        out.setdefault(run["mechanism"], []).append(float(run[key][-1]))
    return out


def final_bpb(runs) -> dict[str, list[float]]:
    """Final validation bits per byte of every run, by mechanism (in the order the runs come).

    ``runs`` are :class:`Run` objects, lists of them by mechanism (what :func:`race` returns) or a recording's
    run dicts (``mechanism``, ``valid_bpb``).
    """
    return _last(runs, "valid_bpb")


def bpb_table(runs) -> str:
    """Final bits per byte (mean and standard deviation over seeds) and training seconds per run, by mechanism.

    ``runs`` as for :func:`final_bpb`; the seconds are each run's own clock (training steps only).
    """
    seconds = _last(runs, "wall_s")
    lines = [f"{'':8s} {'bits per byte ± sd':>17s} {'seconds per run':>16s}"]  # sd: over the seeds
    for name, values in final_bpb(runs).items():
        mean, sd = spread(values)
        lines.append(f"{name:8s} {mean:9.3f} ± {sd:.3f} {statistics.fmean(seconds[name]):16.1f}")
    return "\n".join(lines)


def recording_header(recording: dict) -> str:
    """Three lines on a recorded race (``benchmarks/bench_lm_training.py``): the machine, the date and its load
    average before and after; the model (width, blocks, parameters); the budget (windows, batch, steps, seeds)."""
    env, s = recording["environment"], Setup(**recording["setup"])
    n_params = sum(p.numel() for p in s.model("flow").parameters())
    seeds = len({r["seed"] for r in recording["runs"]})
    load = ""
    if "load_average_before" in env:
        after = env.get("load_average_after", [math.nan])[0]
        load = f", load {env['load_average_before'][0]:.1f} -> {after:.1f}"
    return (
        f"{env['device_name']} ({env['device']}, {env['threads']} thread), {env['date_utc'][:10]}{load};\n"
        f"width {s.dim}, {s.n_layers} blocks, {n_params:,d} parameters;\n"
        f"{s.context}-byte windows, batch {s.batch}, {s.steps} steps, {seeds} seeds"
    )


def quality_cost_table(trained: dict, writing: dict, speed: dict | None = None, *, early: int = 256) -> str:
    """Quality against cost, one row per mechanism, as text for an 80-column page.

    Columns: the recorded race's final bits per byte (mean and standard deviation over seeds, ``trained``: a
    ``bench_lm_training.py`` recording); training tokens per second (``speed``: a ``bench_training.py``
    recording, eager; omitted when None); milliseconds per generated token at ``early`` and at the last
    position, and the state held there (``writing``: a generation recording, its first decoder, medians).
    With ``speed``, a last line gives the nanoGPT-style SDPA model's training speed for reference.
    """
    from . import generation

    ts, times = generation.series(writing, "median_s")
    _, held = generation.series(writing, "state_bytes")
    early = check_int(early, "early", name="quality_cost_table", minimum=1)
    i, last = ts.index(min(t for t in ts if t >= early)), len(ts) - 1
    bpb = final_bpb(trained["runs"])
    head = f"{'':8s}{'bits per byte':>15s}{'train':>10s}{'ms per token':>19s}{'state':>10s}"
    sub = f"{'':8s}{'mean ± sd':>15s}{'tokens/s':>10s}{'t=' + str(ts[i]):>9s}{'t=' + str(ts[last]):>10s}{'KiB':>10s}"
    lines = [head, sub]
    for name, values in bpb.items():
        mean, sd = spread(values)
        rate = f"{speed['steps'][f'{name} eager']['tokens_per_s']:10,.0f}" if speed else f"{'-':>10s}"
        lines.append(
            f"{name:8s}{mean:8.3f} ± {sd:.2f}{rate}{1e3 * times[name][i]:9.2f}{1e3 * times[name][last]:10.2f}"
            f"{held[name][last] / 1024:10.0f}"
        )
    if speed and "nanogpt eager" in speed["steps"]:
        rate = speed["steps"]["nanogpt eager"]["tokens_per_s"]
        lines.append(f"nanoGPT-style SDPA model of the same size: {rate:,.0f} tokens/s")
    return "\n".join(lines)
