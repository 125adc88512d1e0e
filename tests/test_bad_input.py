"""Bad input the library once took silently (issue 28): an eps that underflows or swamps the normaliser, and
attnbook.viz.load_imbalance given top_k = 0, NaN loads or None. Each now gets a clear error naming it."""

import pytest
import torch
from support import qkv

import attnbook
from attnbook.viz.moh import load_imbalance


@pytest.mark.parametrize("name", ["linear_attention", "flow_attention", "mobile_attention"])
@pytest.mark.parametrize(
    "eps, message",
    [(1e-300, r"eps must be 0 or at least float32's smallest normal number"), (1e30, r"eps must be at most 1 ")],
    ids=["underflows", "swamps"],
)
def test_an_eps_float32_cannot_use_is_refused(name, eps, message):
    with pytest.raises(ValueError, match=message):
        getattr(attnbook, name)(*qkv(1, 2, 5, 5, 4, 4), eps=eps)


@pytest.mark.parametrize("name", ["linear_attention", "flow_attention", "mobile_attention"])
def test_the_smallest_accepted_eps_keeps_outputs_finite(name):
    q, k, v = qkv(1, 2, 5, 5, 4, 4)
    assert torch.isfinite(getattr(attnbook, name)(q, k, v, eps=torch.finfo(torch.float32).tiny)).all()
    assert torch.isfinite(getattr(attnbook, name)(q, k, v, eps=1.0)).all()


@pytest.mark.parametrize(
    "load, top_k, error, message",
    [
        ([0.5, 0.5, 0.5, 0.5], 0, ValueError, r"top_k must be an int in 1..4"),
        ([float("nan")] * 4, 2, ValueError, r"load must be a finite number >= 0, got nan"),
        (torch.tensor([0.5, float("nan"), 0.5, 1.0]), 2, ValueError, r"load must be non-negative"),
        (None, 2, TypeError, r"load must be a 1-D tensor, array or sequence of numbers"),
        ([0.5, 0.5], 3, ValueError, r"top_k must be an int in 1..2"),
    ],
    ids=["top_k-0", "nan-list", "nan-tensor", "None", "top_k-above-E"],
)
def test_load_imbalance_refuses_what_it_cannot_measure(load, top_k, error, message):
    with pytest.raises(error, match=f"^load_imbalance: {message}"):
        load_imbalance(load, top_k)
