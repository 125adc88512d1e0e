"""Feature maps phi for kernelized (linear) attention: chapter 2.

Linear attention replaces the softmax kernel exp(q . k / sqrt(D)) by a dot product of features,
sim(q, k) = phi(q) . phi(k), with phi mapping the last dimension D to R non-negative features.

* :func:`elu_feature_map`: phi(x) = elu(x) + 1 (R = D), the map of Katharopoulos et al., "Transformers are
  RNNs: Fast Autoregressive Transformers with Linear Attention", ICML 2020.
* :func:`relu_feature_map`: phi(x) = max(x, 0) (R = D).
* :class:`PerformerFeatures`: FAVOR+ positive orthogonal random features (R = ``num_features``), whose dot
  products are an unbiased estimate of exp(q . k / sqrt(D)) (Choromanski et al., "Rethinking Attention with
  Performers", ICLR 2021, Lemma 1 and Sec. 2.4).
* :func:`resolve_feature_map` turns a spec ("elu", "relu", a callable) into a callable.

A feature map is any callable taking (..., D) to (..., R) that keeps the leading dimensions.

Example:
    >>> import torch, attnbook
    >>> from attnbook.feature_maps import PerformerFeatures
    >>> q, k, v = (torch.randn(1, 2, 10, 8) for _ in range(3))
    >>> phi = PerformerFeatures(num_features=32, dim=8, seed=0)  # R = 32 random features for D = 8
    >>> attnbook.linear_attention(q, k, v, feature_map=phi).shape
    torch.Size([1, 2, 10, 8])
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ._checks import (
    check_bool,
    check_feature_map,
    check_generator,
    check_int,
    check_last_dim,
    check_not_both,
    check_seed,
    check_tensor,
)
from ._runtime import accumulation_dtype, autocast_disabled, result_dtype, tracing

__all__ = ["elu_feature_map", "relu_feature_map", "PerformerFeatures", "resolve_feature_map", "FEATURE_MAPS"]

FeatureMap = Callable[[torch.Tensor], torch.Tensor]


def elu_feature_map(x: torch.Tensor) -> torch.Tensor:
    """phi(x) = elu(x) + 1: positive, (..., D) -> (..., D). Katharopoulos et al., ICML 2020, Eq. 7.

    Computed as exp(x) for x <= 0 and x + 1 for x > 0 (:func:`elu_plus_one`): exp is about twice as fast as
    the expm1 inside ``F.elu``, and the result differs from ``F.elu(x) + 1`` by rounding only (elu(x) + 1
    itself rounds exp(x) - 1 + 1, which is 0 in float32 below x = -17 or so). NaN stays NaN, -inf gives 0,
    inf gives inf.
    Differentiable any number of times: phi'(x) = min(phi(x), 1). Traced (``torch.compile``, ``torch.export``)
    it is ``F.elu(x) + 1``, which a compiler fuses into one kernel with its derivative.

    Example:
        >>> import torch
        >>> from attnbook.feature_maps import elu_feature_map
        >>> elu_feature_map(torch.tensor([-1.0, 0.0, 2.0]))  # exp(x) below 0, x + 1 above
        tensor([0.3679, 1.0000, 3.0000])
    """
    check_tensor(x, "x", name="elu_feature_map")
    if tracing():
        return F.elu(x) + 1.0
    if torch.is_grad_enabled() and x.requires_grad:
        # torch's Function.apply is untyped (no-untyped-call)
        phi: torch.Tensor = _EluPlusOne.apply(x)  # type: ignore[no-untyped-call]
        return phi
    return elu_plus_one(x)


def elu_plus_one(x: torch.Tensor, out: torch.Tensor | None = None, tmp: torch.Tensor | None = None) -> torch.Tensor:
    """elu(x) + 1 without autograd, written into ``out`` (x's shape and dtype, contiguous) when given; ``tmp``
    (the same), when given with ``out``, holds x + 1 for a small x (no fresh tensor: see attnbook._causal).

    It is the median of x + 1, exp(x) and 1 (because exp(x) >= x + 1 everywhere, the median is exp(x) for
    x <= 0 and x + 1 above): three passes (x + 1, exp, and one clamp of 1 between them). On the CPU they run
    over pieces of :data:`ELU_PIECE` numbers, so that each pass reads what the one before it left in the
    cache, and exp(x) is computed as 2^(x log2 e) (:func:`_exp`)."""
    one, log2e = _constants(x)  # the median's third value, broadcast; log2(e)
    n, compiling = x.numel(), tracing()
    write_out = out is not None and out.is_contiguous() and not compiling  # out= needs a contiguous tensor
    pieces = not compiling and x.device.type == "cpu" and n > ELU_PIECE and x.is_contiguous()
    if not (pieces and (out is None or write_out)):
        if write_out:
            e = _exp(x, out=out, log2e=log2e)
            plus = torch.add(x, one) if tmp is None else torch.add(x, one, out=tmp)
            return torch.clamp(one, min=plus, max=e, out=e)
        phi = torch.clamp(one, min=torch.add(x, one), max=_exp(x, log2e=log2e))
        return phi if out is None else out.copy_(phi)
    out = torch.empty_like(x) if out is None else out
    flat, into = x.view(-1), out.view(-1)
    plus = x.new_empty(ELU_PIECE) if tmp is None else tmp.view(-1)[:ELU_PIECE]  # x + 1 of one piece
    for i in range(0, n, ELU_PIECE):
        xs, ys, ps = flat[i : i + ELU_PIECE], into[i : i + ELU_PIECE], plus[: min(ELU_PIECE, n - i)]
        torch.add(xs, one, out=ps)
        _exp(xs, out=ys, log2e=log2e)
        torch.clamp(one, min=ps, max=ys, out=ys)
    return out


def features_into(kind: str, x: torch.Tensor, out: torch.Tensor, tmp: torch.Tensor | None = None) -> torch.Tensor:
    """The built-in feature map named ``kind`` (a key of :data:`FEATURE_MAPS`) of x, without autograd, written
    into ``out`` (x's shape and dtype, contiguous); ``tmp`` as in :func:`elu_plus_one`. The kernels that make
    features into their own buffers (attnbook.linear, attnbook._causal) call this."""
    if kind == "elu":
        return elu_plus_one(x, out=out, tmp=tmp)  # elu(x) + 1, as elu_feature_map
    return torch.clamp(x, min=0.0, out=out)  # max(x, 0), as relu_feature_map


# Numbers per piece of elu_plus_one on the CPU: three float32 pieces of 2 MiB stay in the caches beside other
# work (B=4, H=8, N=4096, D=64, 2 threads: linear_attention 1.35x quicker than with whole 16 MiB tensors; pieces
# of 0.5 to 4 MiB within 6 %).
ELU_PIECE = 1 << 19
_LOG2E = 1.4426950408889634


def _exp(x: torch.Tensor, out: torch.Tensor | None = None, log2e: torch.Tensor | None = None) -> torch.Tensor:
    """exp(x); on the CPU as exp2(x log2 e). torch's CPU exp is MKL's, which on the AMD test machine is 1.6x
    slower than torch's exp2 (Sleef), more than the extra multiplication costs (linear_attention, B=4, H=8,
    N=4096, D=64, 2 threads: 6 % quicker in all). The rounding of x log2 e adds a relative error of at most
    |x| 2^-24, about |x| 6e-8, in float32 (|x| 1.1e-16 in float64): under 1e-6 for |x| < 16, far below
    what a product's rounding over thousands of terms costs. ``log2e``: log2(e) as a 0-dim tensor of x's dtype."""
    if x.device.type != "cpu":
        return torch.exp(x, out=out)
    return torch.mul(x, _LOG2E if log2e is None else log2e, out=out).exp2_()


_CONSTANTS: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]] = {}


def _constants(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(1, log2(e)) as 0-dim tensors of x's dtype and device. On the CPU they are made once per dtype: for a
    small x (one step of a recurrence) making them costs as much as the passes, and a Python number in an
    ``out=`` call costs a copy into a tensor each time."""
    if x.device.type != "cpu" or tracing():
        return x.new_ones(()), x.new_full((), _LOG2E)
    pair = _CONSTANTS.get(x.dtype)
    if pair is None:
        with torch.inference_mode(False):  # ordinary tensors, usable inside and outside inference mode
            pair = _CONSTANTS[x.dtype] = (torch.ones((), dtype=x.dtype), torch.full((), _LOG2E, dtype=x.dtype))
    return pair


class _EluPlusOne(torch.autograd.Function):
    """elu(x) + 1 with its derivative min(phi, 1) formed from the saved output, in differentiable operations
    (so the second derivative, phi for x < 0 and 0 for x > 0, is exact too)."""

    # ctx: torch's FunctionCtx, whose type torch's forward and backward do not declare, hence Any.
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        phi = elu_plus_one(x)  # a Function's forward runs without autograd
        ctx.save_for_backward(phi)
        return phi

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        phi: torch.Tensor
        (phi,) = ctx.saved_tensors
        slope = phi.clamp(max=1.0)  # phi'(x)
        # in place unless a graph of the backward is being built (double backward needs slope itself)
        return slope * grad if torch.is_grad_enabled() else slope.mul_(grad)


def relu_feature_map(x: torch.Tensor) -> torch.Tensor:
    """phi(x) = max(x, 0): non-negative, (..., D) -> (..., D). Rows can be all zero; eps keeps them finite.

    Example:
        >>> import torch
        >>> from attnbook.feature_maps import relu_feature_map
        >>> relu_feature_map(torch.tensor([-1.0, 0.0, 2.0]))
        tensor([0., 0., 2.])
    """
    check_tensor(x, "x", name="relu_feature_map")
    return F.relu(x)


#: The built-in feature maps by name (``LinearAttention(feature_map="elu")``): elu + 1 and ReLU.
FEATURE_MAPS: dict[str, FeatureMap] = {"elu": elu_feature_map, "relu": relu_feature_map}


def _orthogonal_gaussian(
    num_features: int, dim: int, generator: torch.Generator | None, device: torch.device
) -> torch.Tensor:
    """R rows w_r in R^D, orthogonal within blocks of D, each row's norm drawn as that of a N(0, I_D) vector.

    The marginal of every row is N(0, I_D) (Choromanski et al. 2021, Sec. 2.4: orthogonal random features).
    """
    n_blocks = -(-num_features // dim)
    g = torch.randn(n_blocks, dim, dim, generator=generator, device=device, dtype=torch.float64)
    qmat, r = torch.linalg.qr(g)  # (n_blocks, D, D), orthonormal columns (torch types qr's result as Any)
    # Fix the signs QR leaves arbitrary: only then is qmat uniformly (Haar) distributed, and the estimator
    # unbiased (Mezzadri, "How to generate random matrices from the classical compact groups", 2007).
    qmat = qmat * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1)).unsqueeze(-2)  # (n_blocks, D, D)
    w: torch.Tensor = qmat.transpose(-2, -1).reshape(n_blocks * dim, dim)[:num_features]  # (R, D), unit rows
    gaussian = torch.randn(num_features, dim, generator=generator, device=device, dtype=torch.float64)
    norms: torch.Tensor = gaussian.norm(dim=-1)  # (R,); Tensor.norm is untyped in torch
    return w * norms[:, None]  # (R, D)


class PerformerFeatures(nn.Module):
    """FAVOR+ positive random features: phi(q) . phi(k) estimates the softmax kernel exp(q . k / sqrt(D)).

    ::

        phi(x) = exp(W x' - |x'|^2 / 2) / sqrt(R),   x' = x / D^(1/4),   W (R, D) with rows w_r ~ N(0, I_D)

    so that E[phi(q) . phi(k)] = exp(q' . k') = exp(q . k / sqrt(D)) (Choromanski et al., "Rethinking
    Attention with Performers", ICLR 2021, Lemma 1). With ``orthogonal=True`` the rows are orthogonal in
    blocks of D (Sec. 2.4), which lowers the variance. The features are positive, so normalisers never
    vanish. The error shrinks like 1 / sqrt(R), and grows quickly with the norms of q and k (the variance
    of each term is about ``exp(|q' + k'|^2)`` times its mean squared).

    Range: each exponent is ``w_r . x' - |x'|^2 / 2 <= |w_r|^2 / 2``, so features overflow float32 (exponent
    above 88) only when some ``|w_r|^2 > 177``, which for D = 64 is ten standard deviations above its mean; for
    very long q or k the features underflow to 0 and the output goes to 0 (the eps in the denominator).
    The features are evaluated in at least float32 (with autocast off) and returned in the input's dtype
    (under autocast: the autocast dtype); ``linear_attention`` calls them on float32 copies of half inputs.

    Cost: O(N D R) time and O(N R) memory for N vectors.

    Args:
        num_features: R, the number of random features.
        dim: D, the query/key width the features are drawn for.
        generator: a ``torch.Generator`` for reproducible draws (drawn on its device, then stored as a buffer).
        seed: alternatively an int seed in 0..2**64 - 1 (a fresh CPU generator). Neither: torch's global
            random state.
        orthogonal: draw orthogonal blocks (FAVOR+) rather than independent Gaussian rows.

    Shape:
        (..., D) -> (..., R). The buffer ``projection`` (R, D) moves with ``.to(device)``.

    Example:
        >>> import torch
        >>> from attnbook.feature_maps import PerformerFeatures
        >>> phi = PerformerFeatures(num_features=8192, dim=4, seed=0)
        >>> q, k = torch.tensor([0.5, -0.2, 0.1, 0.3]), torch.tensor([0.4, 0.1, -0.3, 0.2])
        >>> estimate, exact = phi(q) @ phi(k), torch.exp(q @ k / 4**0.5)  # the softmax kernel, estimated
        >>> bool(abs(estimate - exact) < 0.05 * exact), tuple(phi(torch.randn(2, 5, 4)).shape)
        (True, (2, 5, 8192))
    """

    projection: torch.Tensor

    def __init__(
        self,
        num_features: int,
        dim: int,
        *,
        generator: torch.Generator | None = None,
        seed: int | None = None,
        orthogonal: bool = True,
    ):
        super().__init__()
        name = "PerformerFeatures"
        num_features = check_int(num_features, "num_features", name=name, minimum=1)
        dim = check_int(dim, "dim", name=name, minimum=1)
        generator = check_generator(generator, name=name)
        orthogonal = check_bool(orthogonal, "orthogonal", name=name)
        if seed is not None:
            seed = check_seed(seed, name=name)
            check_not_both(generator, seed, "generator", "seed", name=name)
            generator = torch.Generator().manual_seed(seed)
        self.num_features, self.dim, self.orthogonal = num_features, dim, orthogonal
        self.register_buffer("projection", self._draw(generator))

    def _draw(self, generator: torch.Generator | None) -> torch.Tensor:
        device = generator.device if generator is not None else torch.device("cpu")
        if self.orthogonal:
            w = _orthogonal_gaussian(self.num_features, self.dim, generator, device)
        else:
            w = torch.randn(self.num_features, self.dim, generator=generator, device=device, dtype=torch.float64)
        return w.to(torch.float32)  # (R, D)

    @torch.no_grad()
    def redraw(self, generator: torch.Generator | None = None) -> None:
        """Draw a new projection in place (Performers redraw features now and then during training).

        ``generator``: a ``torch.Generator`` (its device is where the draw happens) or None (global state).
        """
        generator = check_generator(generator, name="PerformerFeatures.redraw")
        self.projection.copy_(self._draw(generator).to(self.projection.device))

    def extra_repr(self) -> str:
        return f"num_features={self.num_features}, dim={self.dim}, orthogonal={self.orthogonal}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        name = "PerformerFeatures"
        check_last_dim(check_tensor(x, "x", name=name), "x", self.dim, name=name, what="D it was drawn for")
        dtype, acc = result_dtype(x), accumulation_dtype(x.dtype)
        with autocast_disabled(x.device):
            x = x.to(acc) * self.dim**-0.25  # (..., D)
            w = self.projection.to(dtype=acc, device=x.device)  # (R, D)
            logits = x @ w.T - 0.5 * (x * x).sum(dim=-1, keepdim=True)  # (..., R)
            return (torch.exp(logits) * (1.0 / math.sqrt(self.num_features))).to(dtype)  # (..., R)


def resolve_feature_map(spec: str | FeatureMap, *, name: str = "resolve_feature_map") -> FeatureMap:
    """ "elu" | "relu" | any callable (including a :class:`PerformerFeatures`) -> a callable feature map.

    Raises ``ValueError`` for an unknown name and ``TypeError`` for anything else, listing the accepted names;
    ``name`` is the caller quoted in the message.

    Example:
        >>> import torch
        >>> from attnbook.feature_maps import FEATURE_MAPS, resolve_feature_map
        >>> resolve_feature_map("elu") is FEATURE_MAPS["elu"]
        True
        >>> resolve_feature_map(torch.sigmoid) is torch.sigmoid  # a callable is its own feature map
        True
    """
    spec = check_feature_map(spec, sorted(FEATURE_MAPS), name=name)
    return FEATURE_MAPS[spec] if isinstance(spec, str) else spec
