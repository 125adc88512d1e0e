"""attnbook.testing.assert_matches_reference: the float64 comparison, and its low-precision baseline."""

import pytest
import torch

import attnbook
from attnbook import reference
from attnbook.testing import assert_matches_reference


def cancelling(x):
    """x, computed as (x + 1e4) - 1e4: in float32 the result keeps only ~1e-3 of absolute accuracy."""
    return (x + 1e4) - 1e4


def test_an_ill_conditioned_computation_misses_the_tolerance_but_matches_its_baseline():
    x = [torch.randn(50, dtype=torch.float64)]
    with pytest.raises(AssertionError, match="output"):
        assert_matches_reference(cancelling, lambda x: x, x, dtype=torch.float32)
    assert_matches_reference(cancelling, lambda x: x, x, dtype=torch.float32, baseline=cancelling)


def test_a_wrong_result_fails_even_with_a_baseline():
    x = [torch.randn(50, dtype=torch.float64)]
    wrong = lambda x: cancelling(x) + 0.05  # noqa: E731
    with pytest.raises(AssertionError, match=r"output: misses the torch.float32 tolerance, .* more than 2.0 x"):
        assert_matches_reference(wrong, lambda x: x, x, dtype=torch.float32, baseline=cancelling)
    wrong_grad = lambda x: cancelling(x) + 0.5 * (x - x.detach())  # the right values, gradient 1.5  # noqa: E731
    with pytest.raises(AssertionError, match="grad of input 0"):
        assert_matches_reference(wrong_grad, lambda x: x, x, dtype=torch.float32, baseline=cancelling)


def test_the_baseline_must_compute_in_the_dtype_under_test():
    x = [torch.randn(5, dtype=torch.float64)]
    with pytest.raises(AssertionError, match="baseline computed in torch.float64"):
        assert_matches_reference(
            cancelling, lambda x: x, x, dtype=torch.float32, baseline=lambda x: cancelling(x.double())
        )


def test_bad_arguments_are_named():
    """dtype="float32" failed as a device string, an int64 dtype in autograd, a list result with AttributeError,
    no inputs inside torch.autograd.grad, and a negative factor was accepted."""
    import pytest

    q, k, v = (torch.randn(1, 2, 5, 4) for _ in range(3))
    fast, ref = attnbook.flow_attention, reference.flow_attention
    cases = [
        ((fast, ref, [q, k, v]), {"dtype": "float32"}, TypeError, "dtype must be a torch.dtype, got 'float32'"),
        ((fast, ref, [q, k, v]), {"dtype": torch.int64}, ValueError, "dtype must be a floating-point dtype"),
        ((fast, ref, [q, k, v]), {"dtype": torch.float32, "factor": -1}, ValueError, "factor must be a finite"),
        ((lambda *a: [1], ref, [q, k, v]), {"dtype": torch.float32}, TypeError, "fast_fn's result must be a torch"),
        ((fast, ref, []), {"dtype": torch.float32}, ValueError, "inputs must hold at least 1 tensor, got 0"),
    ]
    for args, kwargs, error, message in cases:
        with pytest.raises(error, match=f"^assert_matches_reference: {message}"):
            assert_matches_reference(*args, **kwargs)
