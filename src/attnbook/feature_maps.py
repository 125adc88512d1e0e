"""Feature maps phi for kernelized (linear) attention: chapter 2.

Linear attention replaces the softmax kernel exp(q . k / sqrt(D)) by a dot product of features,
sim(q, k) = phi(q) . phi(k), with phi mapping the last dimension D to R non-negative features.

A feature map is any callable taking (..., D) to (..., R) that keeps the leading dimensions:
:func:`elu_feature_map` (Katharopoulos et al., ICML 2020), :func:`relu_feature_map`, or
:class:`PerformerFeatures` (FAVOR+, Choromanski et al., ICLR 2021); :func:`resolve_feature_map` turns a spec
("elu", "relu", a callable) into one.

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
    check_tensor,
)
from ._runtime import accumulation_dtype, autocast_disabled, result_dtype

__all__ = ["elu_feature_map", "relu_feature_map", "PerformerFeatures", "resolve_feature_map", "FEATURE_MAPS"]

FeatureMap = Callable[[torch.Tensor], torch.Tensor]


def elu_feature_map(x: torch.Tensor) -> torch.Tensor:
    """phi(x) = elu(x) + 1: positive, (..., D) -> (..., D). Katharopoulos et al., ICML 2020, Eq. 7.

    It is exp(x) for x <= 0 and x + 1 for x > 0 (in float32 it rounds to 0 below x of about -17).

    Example:
        >>> import torch
        >>> from attnbook.feature_maps import elu_feature_map
        >>> elu_feature_map(torch.tensor([-1.0, 0.0, 2.0]))  # exp(x) below 0, x + 1 above
        tensor([0.3679, 1.0000, 3.0000])
    """
    check_tensor(x, "x", name="elu_feature_map")
    return F.elu(x).add_(1.0)  # + 1 in place: elu's gradient is taken from x, not from its result


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

    so that E[phi(q) . phi(k)] = exp(q . k / sqrt(D)) (Choromanski et al., "Rethinking Attention with
    Performers", ICLR 2021, Lemma 1); ``orthogonal=True`` draws the rows orthogonal in blocks of D (Sec. 2.4),
    which lowers the variance. The error shrinks like 1 / sqrt(R) and grows quickly with the norms of q and k.
    Each exponent is at most ``|w_r|^2 / 2``, so float32 overflows only for ``|w_r|^2 > 177`` (for D = 64, ten
    standard deviations above its mean). Evaluated in at least float32, returned in the input's dtype.

    Cost: O(N D R) time and O(N R) memory for N vectors.

    Args:
        num_features: R, the number of random features.
        dim: D, the query/key width the features are drawn for.
        generator: a ``torch.Generator`` for reproducible draws (on its device), or ``seed``: an int seed (a
            fresh CPU generator); neither: torch's global random state.
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
            seed = check_int(seed, "seed", name=name, minimum=0, maximum=2**64 - 1)
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
    """ "elu" | "relu" | any callable (including a :class:`PerformerFeatures`) -> a callable feature map; ``name`` is
    the caller quoted in the ``ValueError`` (unknown name) or ``TypeError`` (anything else).

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
