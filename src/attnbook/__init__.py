"""attnbook: attention mechanisms derived step by step, verified against float64 references.

Tensor legend (used in every docstring, einsum string and shape comment)::

    B  batch size              H  number of heads
    N  number of queries       M  number of keys (when it differs from N)
    D  query/key width         Dv value width
    C  model width, H * D      R  feature-map width
    ell  chunk length of a chunked causal form (``chunk_size``)

Layout is head-first, ``(B, H, N, D)``, as in ``torch.nn.functional.scaled_dot_product_attention``. Masks mean
what they mean in torch: ``attn_mask`` as in SDPA (bool True = may attend, or a float added to the scores),
``key_padding_mask`` as in ``nn.MultiheadAttention`` ((B, M), True = padding).

Rules every function, step and layer follows:

* **Bad input** raises ``TypeError`` (wrong type) or ``ValueError`` (wrong value), worded ``<where>: <argument>
  must be <expected>, got <received>``, before torch runs. Every size must be at least 1.
* **Precision.** Softmaxes, sums, normalisers and states accumulate in at least float32; results come back in the
  inputs' dtype (under ``torch.autocast``: the autocast dtype, as torch's SDPA; float64 stays float64).
  Intermediates that would leave float16's range stay in float32 until the output projection.
* **Masks.** A key no query may attend to contributes nothing whatever it holds, NaN included; a query with
  nothing to attend to returns zeros. A NaN in a visible input is never hidden (:mod:`attnbook.softmax`).
* **Derivatives.** Every function is differentiable twice, except softmax attention on torch's fused SDPA kernels.
* **Plain first.** Each mechanism's module is its chapter's mathematics in plain torch; the few paths that exist
  only for speed live in ``attnbook._fast``, turned off by ``ATTNBOOK_PLAIN=1`` (:mod:`attnbook.config`).

Example:
    >>> import torch, attnbook
    >>> q, k, v = (torch.randn(2, 4, 16, 8) for _ in range(3))  # (B, H, N, D)
    >>> fns = attnbook.softmax_attention, attnbook.linear_attention, attnbook.flow_attention
    >>> [tuple(f(q, k, v, is_causal=True).shape) for f in fns]  # one call, three mechanisms
    [(2, 4, 16, 8), (2, 4, 16, 8), (2, 4, 16, 8)]
    >>> layer = attnbook.FlowAttention(32, 32, 32, n_heads=4, causal=True)  # a drop-in layer, (B, N, C)
    >>> layer(torch.randn(2, 16, 32)).shape
    torch.Size([2, 16, 32])
"""

from importlib import metadata as _metadata

from . import config, feature_maps, mechanisms, reference
from ._module import ProjectedAttention, RecurrentAttention
from .delta import DeltaRuleAttention, delta_rule_attention, delta_rule_step
from .flow import FlowAttention, FlowState, FlowStats, flow_attention, flow_attention_step
from .gated import GatedLinearAttention, gated_linear_attention, gated_linear_attention_step
from .linear import LinearAttention, LinearState, linear_attention, linear_attention_step
from .mobile import MobileAttention, mobile_attention
from .moh import HeadRouting, MoHAttention, moh_load_balancing_loss
from .softmax import KVCache, SoftmaxAttention, softmax_attention

try:
    __version__ = _metadata.version("attnbook")
except _metadata.PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"

__all__ = [
    "config",
    "mechanisms",
    "reference",
    "ProjectedAttention",
    "softmax_attention",
    "SoftmaxAttention",
    "KVCache",
    "MoHAttention",
    "HeadRouting",
    "moh_load_balancing_loss",
    "feature_maps",
    "linear_attention",
    "linear_attention_step",
    "LinearState",
    "LinearAttention",
    "flow_attention",
    "flow_attention_step",
    "FlowStats",
    "FlowState",
    "FlowAttention",
    "mobile_attention",
    "MobileAttention",
    "RecurrentAttention",
    "gated_linear_attention",
    "gated_linear_attention_step",
    "GatedLinearAttention",
    "delta_rule_attention",
    "delta_rule_step",
    "DeltaRuleAttention",
]
