"""Checkers for the exercises of chapter 7 (a small language model, generated token by token): 7.1 when a KV
cache outgrows linear attention's state, 7.2 bits per byte from a model's logits, 7.3 one decoding step with a KV
cache, 7.4 the next-byte distribution with a temperature and top-k, 7.5 (explore) the temperature whose
generated text is least varied, checked by generating again with the student's model. Results come back in the
inputs' dtype, float32 included.
"""

from __future__ import annotations

import math
from functools import partial
from typing import NamedTuple

import torch
import torch.nn.functional as F

from .._checks import check_int
from ._core import Case, Diagnosis, Draw, Result, as_number, check_function, check_value, exercise

# --- 7.1 -------------------------------------------------------------------------------------------------


def cache_crossover(D: int) -> int:
    """The first t with 2 t D > D^2 + D: a cache of t keys and values against the state (S, z) of one head."""
    return math.floor((D + 1) / 2) + 1


@exercise("7.1")
def check_cache_crossover(answer, D: int = 16) -> Result:
    """7.1: the first position t at which one head's KV cache holds more numbers than its linear state."""
    D = check_int(D, "D", name="exercises.check('7.1')", minimum=1)  # the head width asked about, not the answer
    return check_value(
        f"the first t at which the cache is larger (D = {D})", answer, cache_crossover(D),
        hint="compare 2 t D numbers (keys and values) with D * D + D (S and z) and solve for t",
        mistakes=[
            ((D + 1) / 2, f"the cache is larger for t > {(D + 1) / 2:g}; the question asks for the first whole t."),
            (D + 1, "the cache holds keys and values, 2 t D numbers, not t D."),
            (math.floor((D + 1) / 2), "that is the last t at which the cache is not larger; the next one is."),
        ],
    )  # fmt: skip


# --- 7.2 -------------------------------------------------------------------------------------------------


def _bpb(logits, tokens, *, pair="next", base=2.0, of_mean=False, summed=False, sign=1.0, in_dtype=False) -> float:
    """Bits per byte with one piece changed: which byte the logits are scored against (``pair``), the base, the log
    of the mean probability, the sum, the sign, the log of a softmax in the logits' dtype (where exp(-120) = 0)."""
    pairs = {"next": (logits[:, :-1], tokens[:, 1:]), "same": (logits, tokens), "back": (logits[:, 1:], tokens[:, :-1])}
    lg, tk = pairs[pair]
    logp = F.softmax(lg, dim=-1).log().double() if in_dtype else F.log_softmax(lg.double(), dim=-1)  # (B, N - 1, 256)
    picked = logp.gather(-1, tk.unsqueeze(-1))  # (B, N - 1, 1)
    nats = -picked.exp().mean().log() if of_mean else -picked.mean()
    return sign * float(nats) / math.log(base) * (tk.numel() if summed else 1)


def reference_bits_per_byte(logits: torch.Tensor, tokens: torch.Tensor) -> float:
    """Mean -log2 p(tokens[:, t + 1] | logits[:, t]) over t < N - 1 and the batch, in float64: logits (B, N, 256),
    the scores of the byte after each position; tokens (B, N), the bytes."""
    return _bpb(logits, tokens)


def _bits(**variant):
    """(logits, tokens) -> the bits per byte of ``variant`` as a 0-d tensor in the logits' dtype (a Python or numpy
    number is taken as that dtype; a 0-d tensor of another dtype is named as such)."""
    return lambda logits, tokens: torch.tensor(_bpb(logits, tokens, **variant), dtype=logits.dtype)


LARGE_LOGITS = (
    "every logit on these inputs is shifted by several hundred, which changes no probability: subtract each "
    "row's largest value before exp (torch.softmax and torch.log_softmax do), or exp overflows to inf"
)
CONFIDENTLY_WRONG = (
    "on these inputs the model is confidently wrong: the logit of the byte that came next is 120 (or 800) below "
    "the largest"
)


def _confidently_wrong(B: int, N: int, gap: float, seed: int, dtype=torch.float64) -> tuple:
    """Logits (B, N, 256) that put ``gap`` more on a wrong byte than on the byte that really came next, at every
    position: the next byte's probability exp(-gap) is below float32's smallest number for gap = 120 (and below
    float64's for 800), while its log-probability, -gap, is an ordinary number."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(256, (B, N), generator=g)
    logits = torch.randn(B, N, 256, generator=g, dtype=torch.float64)
    wrong = (tokens.roll(-1, dims=1) + 1 + torch.randint(255, (B, N), generator=g)) % 256  # never the next byte
    return logits.scatter(-1, wrong.unsqueeze(-1), gap).to(dtype), tokens  # the model's confident, wrong guess


def _bpb_cases(draw: Draw) -> list[Case]:
    def random_bytes(n, dtype):
        B = draw.int(1, 3)
        tokens = torch.randint(256, (B, n), generator=draw.g)
        logits = draw.randn(B, n, 256, scale=draw.uniform(0.5, 4.0), dtype=dtype)
        return (logits, tokens), f"logits for {B} sequences of {n} bytes"

    g = torch.Generator().manual_seed(7)
    tokens = torch.randint(256, (2, 9), generator=g)
    logits = torch.randn(2, 9, 256, generator=g, dtype=torch.float64) * 2
    peaked = torch.full((1, 5, 256), -4.0, dtype=torch.float64)
    abcab = torch.tensor([list(b"abcab")])
    peaked[0, torch.arange(4), abcab[0, 1:]] = 4.0  # a confident model that is right
    long_tokens = torch.randint(256, (2, 64), generator=g)
    long_logits = torch.randn(2, 64, 256, generator=g, dtype=torch.float64) * 3
    text = torch.tensor([list(b"def f(x):\n    return x\n" * 4)])  # (1, 100)
    unsure = torch.randn(1, text.shape[1], 256, generator=g, dtype=torch.float64)  # an unsure model
    return [
        Case((logits, tokens), label="random logits for 2 sequences of 9 bytes"),
        Case((peaked, abcab), label='a confident, right model on "abcab"'),
        Case((torch.zeros(1, 2, 256, dtype=torch.float64), torch.tensor([[65, 66]])), label="the uniform guess"),
        Case((long_logits, long_tokens), label="random logits for 2 sequences of 64 bytes"),
        Case((unsure, text), label="an unsure model on 100 bytes of code"),
        Case((logits + 800, tokens), label="the random logits shifted by 800", note=LARGE_LOGITS),
        Case((long_logits + 900, long_tokens), label="64 bytes, logits shifted by 900", note=LARGE_LOGITS),
        Case((logits.float(), tokens), label="float32 random logits for 2 sequences of 9 bytes"),
        Case(_confidently_wrong(2, 7, 120.0, 75, torch.float32), label="float32, a confidently wrong model (a logit "
             "gap of 120)", note=CONFIDENTLY_WRONG),
        Case(_confidently_wrong(1, 12, 800.0, 76), label="a confidently wrong model (a logit gap of 800)",
             note=CONFIDENTLY_WRONG),
        *draw.cases(random_bytes, long=(65, 400), short=(2, 40)),
    ]  # fmt: skip


@exercise("7.2")
def check_bits_per_byte(fn, *, seed: int | None = None) -> Result:
    """7.2: ``fn(logits, tokens)`` -> the mean bits per byte of the next-byte predictions, a number (or a 0-d
    tensor in the logits' dtype)."""
    return check_function(
        fn, _bpb_cases(Draw(seed)), expected=_bits(), name="bits_per_byte",
        success="bits_per_byte is right on every input, float32 and a confidently wrong model included.",
        diagnoses=[
            Diagnosis("a probability that is 0 in the logits' dtype: softmax gives exp(-120) = 0 in float32 (and "
                      "exp(-800) = 0 in float64), and -log2 0 = inf overflows the mean; take log_softmax, whose "
                      "log-probability -120 is an ordinary number", _bits(in_dtype=True)),
            Diagnosis("the loss is in nats (natural log): divide by ln 2 for bits", _bits(base=math.e)),
            Diagnosis("each position's logits are scored against the byte at that position; they predict the next one "
                      "(compare logits[:, :-1] with tokens[:, 1:])", _bits(pair="same")),
            Diagnosis("the logarithm is base 10: bits need log base 2", _bits(base=10.0)),
            Diagnosis("the probabilities are averaged before taking the log; average the log-probabilities instead",
                      _bits(of_mean=True)),
            Diagnosis("the bits are summed over the predicted bytes; the mean is asked for", _bits(summed=True)),
            Diagnosis("the shift goes the wrong way: logits[:, t] predicts tokens[:, t + 1], so compare logits[:, :-1] "
                      "with tokens[:, 1:]", _bits(pair="back")),
            Diagnosis("the sign is missing: the cost of a byte is -log2 p, which is positive", _bits(sign=-1.0)),
        ],
    )  # fmt: skip


# --- 7.3 -------------------------------------------------------------------------------------------------


class CachedStep(NamedTuple):
    """What one decoding step returns: the output of the new token and the cache including it."""

    out: torch.Tensor  # (B, H, Dv)
    keys: torch.Tensor  # (B, H, t, D)
    values: torch.Tensor  # (B, H, t, Dv)


def _cached(q_t, k_t, v_t, keys, values, *, before=False, scale=True, weights="softmax", first=False, keep=False):
    """The step with one piece changed: attending ``before`` the append, no scale, the weights of a top-left causal
    mask (``"first"``: key 0 only) or of a softmax over the query axis (``"ones"``), the new token put ``first``
    in the cache, the cache returned as it came in (``keep``)."""

    def put(cache, x_t):  # (B, H, t, D|Dv): the cache with the new token at the end, or first
        return torch.cat([x_t.unsqueeze(2), cache] if first else [cache, x_t.unsqueeze(2)], dim=2)

    new_k, new_v = put(keys, k_t), put(values, v_t)
    k, v = (keys, values) if before else (new_k, new_v)  # the output does not depend on the keys' order
    scores = (k.double() @ q_t.double().unsqueeze(-1)).squeeze(-1) / (math.sqrt(q_t.shape[-1]) if scale else 1.0)
    if weights == "softmax":
        w = scores.softmax(dim=-1)  # (B, H, t)
    else:
        w = torch.ones_like(scores) if weights == "ones" else (torch.arange(k.shape[2]) == 0).to(scores)
    out = (w.unsqueeze(-2) @ v.double()).squeeze(-2).to(q_t.dtype)  # (B, H, Dv)
    return CachedStep(out, keys, values) if keep else CachedStep(out, new_k, new_v)


def reference_cached_step(q_t, k_t, v_t, keys, values) -> CachedStep:
    """Append k_t, v_t (B, H, D) to the cache keys, values (B, H, t - 1, D), then attend with q_t over all t, in
    float64 (q_t's dtype out; the cache keeps its own dtype)."""
    return _cached(q_t, k_t, v_t, keys, values)


def _cache(g: torch.Generator, B, H, past, D, *, shift=0.0, dtype=torch.float64) -> tuple:
    """q, k, v (B, H, D) of a new token and a cache of ``past`` keys and values (B, H, past, D), drawn by ``g``.

    ``shift``: one direction added to the query and to every key, which adds about shift^2 / sqrt(D) to every score
    (the same for all keys, up to shift times a unit-size term): exp overflows, softmax does not."""
    q, k, v = (torch.randn(B, H, D, generator=g, dtype=torch.float64) for _ in range(3))
    keys, values = (torch.randn(B, H, past, D, generator=g, dtype=torch.float64) for _ in range(2))
    u = torch.zeros(D, dtype=torch.float64)
    u[0] = shift
    return tuple(x.to(dtype) for x in (q * 2 + u, k * 2 + u, v, keys * 2 + u, values))


def _cached_cases(draw: Draw) -> list[Case]:
    g = torch.Generator().manual_seed(73)

    def random_cache(past, dtype):
        B, H, D = draw.int(1, 2), draw.int(1, 3), draw.int(1, 40, avoid=(2, 3, 4, 8, 9))
        return _cache(draw.g, B, H, past, D, dtype=dtype), f"token after {past} cached ones (B={B}, H={H}, D={D})"

    random = draw.cases(random_cache, long=(64, 400), short=(0, 40), over=11)
    f32 = torch.float32
    return [
        Case(_cache(g, 2, 3, 5, 4), label="a token after 5 cached ones (B=2, H=3, D=4)"),
        Case(_cache(g, 1, 2, 0, 8), label="the first token (an empty cache)"),
        Case(_cache(g, 1, 1, 11, 2), label="a token after 11 cached ones (D=2)"),
        Case(_cache(g, 1, 2, 63, 8), label="the 64th token (63 cached, D=8)"),
        Case(_cache(g, 2, 1, 70, 3), label="a token after 70 cached ones (B=2, D=3)"),
        Case(_cache(g, 1, 2, 6, 4, shift=40.0), label="scores shifted by about 800 (6 cached, D=4)", note=LARGE_LOGITS),
        Case(_cache(g, 2, 1, 20, 9, shift=47.5), label="scores shifted by about 750 (20 cached, D=9)",
             note=LARGE_LOGITS),
        Case(_cache(g, 2, 3, 5, 4, dtype=f32), label="float32, a token after 5 cached ones (B=2, H=3, D=4)"),
        Case(_cache(g, 1, 2, 9, 4, shift=20.0, dtype=f32), label="float32, scores shifted by about 200 (9 cached, "
             "D=4)", note=LARGE_LOGITS),
        *random,
    ]  # fmt: skip


@exercise("7.3")
def check_cached_step(fn, *, seed: int | None = None) -> Result:
    """7.3: ``fn(q_t, k_t, v_t, keys, values)`` -> (out_t, keys, values), the new token appended, in the inputs'
    dtype."""
    return check_function(
        fn, _cached_cases(Draw(seed)), expected=reference_cached_step, name="cached_step",
        success="cached_step is right on every input, float32 and caches of up to 400 tokens included.",
        diagnoses=[
            Diagnosis("the query attends to the cache before the new key and value are added: the newest token must "
                      "see itself too", partial(_cached, before=True)),
            Diagnosis("the scores are not divided by sqrt(D)", partial(_cached, scale=False)),
            Diagnosis("a causal mask is applied to the single new query: top-left aligned it lets the query see only "
                      "the first key, whereas the newest query may see every cached key",
                      partial(_cached, weights="first")),
            Diagnosis("the new key and value are put first in the cache; they belong at the end",
                      partial(_cached, first=True)),
            Diagnosis("the softmax is taken over the (single) query instead of over the keys, so every weight is 1",
                      partial(_cached, weights="ones")),
            Diagnosis("the returned cache does not hold the new token: return the keys and values with k_t and v_t "
                      "appended", partial(_cached, keep=True)),
        ],
    )  # fmt: skip


# --- 7.4 -------------------------------------------------------------------------------------------------


def reference_next_byte_distribution(logits: torch.Tensor, temperature: float, top_k: int | None) -> torch.Tensor:
    """softmax(logits / temperature) over the top_k largest logits of each row (all if None), zero elsewhere;
    ``temperature`` > 0 (``generate`` treats 0 apart: greedy)."""
    scaled = logits / temperature  # (B, 256)
    if top_k is not None:
        kth = scaled.topk(top_k, dim=-1).values[:, -1:]  # (B, 1)
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    return scaled.softmax(dim=-1)


def _sampled(logits, temperature, top_k, *, power=-1, smallest=False, strict=False, extra=0, renorm=True):
    """The distribution with one piece changed: the logits times temperature^``power`` (-1: divided by it), the k
    ``smallest`` kept, the k-th itself dropped (``strict``), ``extra`` more bytes kept, no renormalising."""
    scaled = logits * temperature**power  # (B, 256)
    if top_k is None:
        return scaled.softmax(dim=-1)
    sign = -1.0 if smallest else 1.0
    kth = (sign * scaled).topk(min(top_k + extra, logits.shape[-1]), dim=-1).values[:, -1:]  # (B, 1)
    drop = sign * scaled <= kth if strict else sign * scaled < kth
    return scaled.masked_fill(drop, -math.inf).softmax(dim=-1) if renorm else scaled.softmax(-1).masked_fill(drop, 0)


def _distribution_cases(draw: Draw) -> list[Case]:
    drawn = []
    for _ in range(2):  # other temperatures, top-k and batch sizes
        B, T = draw.int(1, 80), round(draw.uniform(0.2, 2.5), 3)
        k = draw.choice((None, draw.int(1, 256, avoid=(1, 5, 10, 40, 64, 256))))
        top = "no top-k" if k is None else f"top-{k}"
        label = draw.label(f"{B} rows, temperature {T:g}, {top}")
        drawn.append(Case((draw.randn(B, 256, scale=draw.uniform(0.5, 4.0)), T, k), label=label))
    g = torch.Generator().manual_seed(74)
    logits = torch.randn(3, 256, generator=g, dtype=torch.float64) * 3
    more = torch.randn(64, 256, generator=g, dtype=torch.float64) * 2
    return [
        Case((logits, 0.7, 5), label="temperature 0.7, top-5"),
        Case((logits, 1.0, None), label="temperature 1, no top-k"),
        Case((logits, 2.0, 40), label="temperature 2, top-40"),
        Case((logits[:1], 0.5, 1), label="top-1 (greedy)"),
        Case((logits, 0.5, None), label="temperature 0.5, no top-k"),
        Case((more, 1.5, None), label="64 rows, temperature 1.5, no top-k"),
        Case((more, 1.3, 64), label="64 rows, temperature 1.3, top-64"),
        Case((logits, 0.9, 256), label="temperature 0.9, top-256 (every byte)"),
        Case((logits.float(), 0.8, 10), label="float32 logits, temperature 0.8, top-10"),
        Case((logits + 80, 0.1, None), label="logits shifted by 80, temperature 0.1", note=LARGE_LOGITS),
        Case((logits.float() + 10, 0.1, 10), label="float32, shifted by 10, temperature 0.1, top-10",
             note=LARGE_LOGITS),
        *drawn,
    ]  # fmt: skip


@exercise("7.4")
def check_next_byte_distribution(fn, *, seed: int | None = None) -> Result:
    """7.4: ``fn(logits, temperature, top_k)`` -> (B, 256) probabilities of the next byte."""
    return check_function(
        fn, _distribution_cases(Draw(seed)), expected=reference_next_byte_distribution, name="next_byte_distribution",
        success="next_byte_distribution is right on every input.",
        diagnoses=[
            Diagnosis("the logits are multiplied by the temperature; divide them by it", partial(_sampled, power=1)),
            Diagnosis("the top-k probabilities are kept but not renormalised: they must sum to 1 again",
                      partial(_sampled, renorm=False)),
            Diagnosis("the k smallest logits are kept instead of the k largest", partial(_sampled, smallest=True)),
            Diagnosis("the temperature is applied only with top-k: without top-k the logits must be divided by it too",
                      lambda logits, t, top_k: _sampled(logits, t, top_k, power=0 if top_k is None else -1)),
            Diagnosis("the temperature has no effect: divide the logits by it before the softmax (dividing the "
                      "probabilities cancels when they are renormalised)", partial(_sampled, power=0)),
            Diagnosis("only k - 1 bytes are kept: the k-th largest logit itself stays (mask the scores < kth, not <= "
                      "kth)", partial(_sampled, strict=True)),
            Diagnosis("k + 1 bytes are kept instead of k", partial(_sampled, extra=1)),
        ],
    )  # fmt: skip


# --- 7.5 -------------------------------------------------------------------------------------------------

WRITING = {"temperatures": (0, 0.5, 1.0, 1.5), "n_new": 200, "seed": 0}  # the experiment of exercise 7.5


def _variety(model, prompt: torch.Tensor) -> dict[float, float]:
    """For each temperature, the fraction of distinct 4-byte windows of the text ``model`` writes after ``prompt``
    (the prompt left out), as the chapter's solution measures it."""
    from ..lab.lm import distinct_fraction  # deferred: lab imports the package

    out = {}
    for temperature in WRITING["temperatures"]:
        written = model.generate(prompt, WRITING["n_new"], temperature=temperature, seed=WRITING["seed"])
        out[temperature] = distinct_fraction(bytes(written[0, prompt.shape[1] :].tolist()))
    return out


@exercise("7.5")
def check_least_varied_temperature(answer, *, model, prompt) -> Result:
    """7.5: the temperature (of 0, 0.5, 1, 1.5) at which ``model`` writes the least varied text after ``prompt``.

    The checker writes the 200 bytes again at each temperature (seed 0, as the chapter does), which repeats itself
    exactly; any temperature of least variety is right."""
    from ..lm import DecoderLM

    name = "7.5 least varied temperature"
    if not isinstance(model, DecoderLM):
        return Result(False, f"7.5: model= must be the trained DecoderLM (runs['softmax'][0].model), got "
                      f"{type(model).__name__}.")  # fmt: skip
    if not isinstance(prompt, torch.Tensor) or prompt.dim() != 2 or prompt.shape[0] != 1:
        return Result(False, "7.5: prompt= must be the chapter's prompt, a (1, P) tensor of bytes.")
    value = as_number(answer)
    if answer is None or value is None:
        return check_value(name, answer, 0.0)  # "no answer yet" / "expected a number, got ..."
    variety = _variety(model, prompt)
    shown = ", ".join(f"T={t:g}: {f:.2f}" for t, f in variety.items())
    least = min(variety.values())
    if value not in variety:
        temperatures = ", ".join(f"{t:g}" for t in variety)
        if 0 <= value <= 1 and any(abs(value - f) < 1e-9 for f in variety.values()):
            return Result(False, f"{name}: {value:g} is a fraction of distinct windows; answer the temperature ("
                          f"{temperatures}) whose text has the smallest one ({shown}).")  # fmt: skip
        return Result(False, f"{name}: {value:g} is not one of the temperatures tried, {temperatures}.")
    if variety[value] == least:
        return Result(True, f"{name}: {value:g} is right ({shown}).")
    if variety[value] == max(variety.values()):
        return Result(False, f"{name}: {value:g} is not right: its text is the most varied ({shown}); the "
                      "question asks for the least varied.")  # fmt: skip
    return Result(False, f"{name}: {value:g} is not right: its text has {variety[value]:.2f} of its 4-byte windows "
                  f"distinct, another has fewer ({shown}).")  # fmt: skip
