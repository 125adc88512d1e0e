"""Feature maps: elu + 1, relu, FAVOR+ random features, and how specs resolve."""

import math

import pytest
import torch
from support import tol

import attnbook
from attnbook import reference
from attnbook.feature_maps import PerformerFeatures, elu_feature_map, relu_feature_map, resolve_feature_map


def test_elu_plus_one_is_positive_and_equals_its_definition():
    x = torch.linspace(-20, 5, 101, dtype=torch.float64)
    fx = elu_feature_map(x)
    assert (fx > 0).all()
    torch.testing.assert_close(fx, torch.where(x > 0, x + 1, torch.exp(x)))
    special = torch.tensor([float("nan"), float("inf"), -float("inf")])
    torch.testing.assert_close(
        elu_feature_map(special), torch.tensor([float("nan"), float("inf"), 0.0]), equal_nan=True
    )


def test_elu_plus_one_derivatives_of_every_order():
    x = torch.randn(30, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(elu_feature_map, (x,))
    assert torch.autograd.gradgradcheck(elu_feature_map, (x,))
    (g,) = torch.autograd.grad(elu_feature_map(x).sum(), x)
    torch.testing.assert_close(g, torch.where(x > 0, 1.0, torch.exp(x)).detach())


def test_relu_is_max_with_zero():
    x = torch.randn(3, 7)
    torch.testing.assert_close(relu_feature_map(x), x.clamp(min=0))


def test_resolve_feature_map():
    assert resolve_feature_map("elu") is elu_feature_map
    assert resolve_feature_map("relu") is relu_feature_map
    phi = PerformerFeatures(4, 2, seed=0)
    assert resolve_feature_map(phi) is phi
    fn = torch.tanh
    assert resolve_feature_map(fn) is fn
    with pytest.raises(ValueError, match=r"feature_map must be 'elu', 'relu', a callable .*got 'ELU'"):
        resolve_feature_map("ELU")
    with pytest.raises(TypeError, match="feature_map must be 'elu', 'relu', .*got None"):
        resolve_feature_map(None)


class TestPerformer:
    def test_shape_positivity_and_reproducible_draws(self):
        x = torch.randn(2, 3, 5, 8)
        a = PerformerFeatures(20, 8, seed=3)
        b = PerformerFeatures(20, 8, generator=torch.Generator().manual_seed(3))
        c = PerformerFeatures(20, 8, seed=4)
        fx = a(x)
        assert fx.shape == (2, 3, 5, 20) and (fx > 0).all()
        torch.testing.assert_close(b(x), fx)  # a seed and a generator seeded alike draw the same features
        assert not torch.allclose(c(x), fx)

    def test_orthogonal_blocks_and_gaussian_norms(self):
        phi = PerformerFeatures(20, 8, seed=0)
        w = phi.projection.double()  # (R, D)
        assert w.shape == (20, 8)
        for start in range(0, 20, 8):
            block = w[start : start + 8]
            gram = block @ block.T
            off_diagonal = gram - torch.diag(torch.diagonal(gram))
            assert off_diagonal.abs().max() < 1e-5, "rows of a block must be orthogonal"
        big = PerformerFeatures(4096, 16, seed=0).projection.double()
        # a N(0, I_16) row has E|w|^2 = 16: the norms are not those of unit vectors
        assert abs((big * big).sum(-1).mean().item() - 16) < 0.5

    def test_redraw_changes_the_projection_in_place(self):
        phi = PerformerFeatures(6, 4, seed=0)
        before = phi.projection.clone()
        phi.redraw(torch.Generator().manual_seed(1))
        assert not torch.equal(phi.projection, before)
        torch.testing.assert_close(phi.projection, PerformerFeatures(6, 4, seed=1).projection)

    def test_moves_and_casts_like_a_module(self):
        phi = PerformerFeatures(6, 4, seed=0).double()
        assert phi.projection.dtype == torch.float64
        assert phi(torch.randn(3, 4, dtype=torch.float64)).dtype == torch.float64
        assert phi(torch.randn(3, 4)).dtype == torch.float32

    @pytest.mark.parametrize("orthogonal", [True, False], ids=["orthogonal", "iid"])
    def test_kernel_estimate_approaches_the_softmax_kernel_as_features_grow(self, orthogonal):
        """phi(q) . phi(k) -> exp(q . k / sqrt(D)); the error falls roughly like 1 / sqrt(R)."""
        D = 16
        q, k = torch.randn(64, D) * 0.5, torch.randn(64, D) * 0.5
        exact = torch.exp(q @ k.T / math.sqrt(D))  # (N, M)
        errors = {}
        for R in (16, 256, 4096):
            phi = PerformerFeatures(R, D, seed=0, orthogonal=orthogonal)
            estimate = phi(q) @ phi(k).T  # (N, M)
            errors[R] = ((estimate - exact).abs().mean() / exact.mean()).item()
        assert errors[16] > errors[256] > errors[4096], errors
        assert errors[4096] < 0.05, errors
        assert errors[16] > 4 * errors[4096], errors  # 256x more features: ~16x smaller error expected

    def test_orthogonal_draws_are_unbiased(self):
        """With many features the estimate converges to the kernel itself, not to something near it.

        (Orthogonal blocks from a QR decomposition without the sign fix are not Haar-distributed: their
        estimate stalls at a few percent error however many features are drawn.)
        """
        D = 16
        q, k = torch.randn(64, D) * 0.3, torch.randn(64, D) * 0.3
        exact = torch.exp(q @ k.T / math.sqrt(D))  # (N, M)
        phi = PerformerFeatures(65536, D, seed=0)
        error = ((phi(q) @ phi(k).T - exact).abs().mean() / exact.mean()).item()
        assert error < 0.006, error

    def test_attention_approaches_softmax_attention_as_features_grow(self):
        D = 8
        q, k, v = torch.randn(1, 2, 32, D) * 0.5, torch.randn(1, 2, 40, D) * 0.5, torch.randn(1, 2, 40, 5)
        exact = reference.softmax_attention(q, k, v)
        errors = []
        for R in (16, 256, 4096):
            out = attnbook.linear_attention(
                q.double(), k.double(), v.double(), feature_map=PerformerFeatures(R, D, seed=0)
            )
            errors.append((out - exact).abs().max().item())
        assert errors[0] > errors[1] > errors[2], errors
        assert errors[2] < 0.05, errors
        # elu + 1 is a different kernel: its error does not shrink with anything
        assert (attnbook.linear_attention(q, k, v).double() - exact).abs().max() > errors[2]

    def test_float32_features_of_half_inputs_are_finite(self):
        phi = PerformerFeatures(64, 64, seed=0)
        x = (torch.randn(4, 64) * 4).to(torch.float16)
        out = attnbook.linear_attention(x[None, None], x[None, None], x[None, None], feature_map=phi)
        assert out.dtype == torch.float16 and torch.isfinite(out).all()
        torch.testing.assert_close(
            out.float(), attnbook.linear_attention(*(x.float()[None, None],) * 3, feature_map=phi), **tol(torch.float16)
        )

    @pytest.mark.parametrize(
        "kwargs, error, message",
        [
            (dict(num_features=0, dim=4), ValueError, "num_features must be an int >= 1, got 0"),
            (dict(num_features=4, dim=2.5), TypeError, "dim must be an int, got 2.5"),
            (dict(num_features=4, dim=4, seed=1, generator=torch.Generator()), ValueError, "seed must be None when"),
            (dict(num_features=4, dim=4, seed=1.5), TypeError, "seed must be an int, got 1.5"),
            (dict(num_features=4, dim=4, generator=3), TypeError, "generator must be a torch.Generator or None, got 3"),
            (dict(num_features=4, dim=4, orthogonal="no"), TypeError, "orthogonal must be True or False, got 'no'"),
        ],
        ids=["features", "dim", "seed_and_generator", "float_seed", "int_generator", "string_flag"],
    )
    def test_bad_construction(self, kwargs, error, message):
        with pytest.raises(error, match=message):
            PerformerFeatures(**kwargs)

    def test_bad_redraw_and_input_say_what_was_wrong(self):
        phi = PerformerFeatures(8, 4, seed=0)
        with pytest.raises(TypeError, match="redraw: generator must be a torch.Generator or None, got 7"):
            phi.redraw(7)
        with pytest.raises(TypeError, match="x must be a torch.Tensor, got a list of length 1"):
            phi([[1.0, 2.0, 3.0, 4.0]])
        with pytest.raises(TypeError, match="x must be a floating-point tensor, got a int64 tensor"):
            phi(torch.ones(2, 4, dtype=torch.long))

    def test_wrong_width_raises_value_error_naming_the_shape(self):
        with pytest.raises(ValueError, match=r"last dimension of size 4 \(D it was drawn for\), got .* \(2, 5\)"):
            PerformerFeatures(8, 4, seed=0)(torch.randn(2, 5))
