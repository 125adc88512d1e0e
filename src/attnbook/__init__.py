"""attnbook: attention mechanisms derived step by step, verified against float64 references.

Tensor legend (used in every docstring, einsum string and shape comment)::

    B  batch size              H  number of heads
    N  number of queries       M  number of keys (when it differs from N)
    D  query/key width         Dv value width
    C  model width, H * D      R  feature-map width

Layout is head-first, ``(B, H, N, D)``, as in ``torch.nn.functional.scaled_dot_product_attention``.
Boolean masks use True = "may attend".
"""

from importlib import metadata as _metadata

from . import config, feature_maps, mechanisms, reference
from ._module import ProjectedAttention
from .flow import FlowAttention, FlowState, FlowStats, flow_attention, flow_attention_step
from .linear import LinearAttention, LinearState, linear_attention, linear_attention_step
from .mobile import MobileAttention, mobile_attention
from .moh import HeadRouting, MoHAttention, moh_load_balancing_loss
from .softmax import SoftmaxAttention, softmax_attention

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
]
