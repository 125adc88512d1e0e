"""The head-routing explorer (attnbook.viz.moh): compute functions, figures and the live widget."""

import ipywidgets as widgets
import numpy as np
import pytest
import torch
from matplotlib.figure import Figure

import attnbook
from attnbook.viz import moh as vm

CONFIGS = {  # (n_heads, shared, top_k)
    "default": (8, 2, 2),
    "no_shared": (4, 0, 1),
    "one_shared": (6, 1, 3),
    "all_routed_chosen": (3, 0, 3),
    "all_shared": (5, 5, 0),
}
N_TOKENS = 48


@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
def test_shapes_and_settings(config):
    H, S, K = config
    s = vm.compute_routing(H, S, K, n_tokens=N_TOKENS, dim=16)
    E = H - S
    assert s.gates.shape == (N_TOKENS, H) and s.selected.shape == (N_TOKENS, H)
    assert s.selected.dtype == torch.bool
    assert s.routed_probs.shape == (N_TOKENS, E if K else 0)
    assert s.load.shape == (E,)
    assert (s.n_heads, s.shared, s.top_k, s.routed, s.step) == (H, S, K, E, 0)
    assert s.target == pytest.approx(K / E if E else 0.0)
    assert s.tokens.shape == (1, N_TOKENS, 16)


@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
def test_shared_heads_always_on_and_exactly_top_k_routed_heads_per_token(config):
    H, S, K = config
    s = vm.compute_routing(H, S, K, temperature=0.5, seed=3, n_tokens=N_TOKENS, dim=16)
    assert s.selected[:, :S].all()
    assert (s.gates[:, :S] > 0).all()
    assert torch.equal(s.selected[:, S:].sum(dim=1), torch.full((N_TOKENS,), K))
    assert (s.gates[:, S:][s.selected[:, S:]] > 0).all()
    assert torch.equal(s.gates[:, S:][~s.selected[:, S:]], torch.zeros(N_TOKENS * (H - S - K), dtype=torch.float64))


def test_gate_sums_follow_the_two_stage_weighting():
    """Shared gates sum to a_1 h_s, routed ones to a_2 k, and a_1 + a_2 = 2 for every token."""
    H, S, K = 8, 3, 2
    s = vm.compute_routing(H, S, K, n_tokens=N_TOKENS, dim=16)
    total = s.gates[:, :S].sum(dim=1) / S + s.gates[:, S:].sum(dim=1) / K
    torch.testing.assert_close(total, torch.full((N_TOKENS,), 2.0, dtype=torch.float64), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("config", [CONFIGS["default"], CONFIGS["one_shared"]], ids=["default", "one_shared"])
def test_load_is_the_share_of_tokens_per_routed_head_and_loss_is_its_definition(config):
    H, S, K = config
    s = vm.compute_routing(H, S, K, n_tokens=N_TOKENS, dim=16)
    E = H - S
    torch.testing.assert_close(s.load, s.selected[:, S:].to(torch.float64).mean(dim=0))
    assert float(s.load.sum()) == pytest.approx(K)
    expected = E * float((s.load * s.routed_probs.mean(dim=0)).sum())
    assert s.loss == pytest.approx(expected, rel=1e-5)


def _balanced_router(E, k, per_head, scale):
    """A router whose top-k choices spread the tokens evenly: token group i prefers heads i..i+k-1."""
    layer = attnbook.MoHAttention(E, num_heads=E, shared_head=0, routed_head=k, head_dim=2)
    with torch.no_grad():
        layer.wg.weight.copy_(torch.eye(E) * scale)
    rows = []
    for i in range(E):
        row = torch.zeros(E)
        row[[(i + j) % E for j in range(k)]] = torch.linspace(1.0, 0.5, k)
        rows.append(row)
    return layer, torch.stack(rows).repeat(per_head, 1)[None]  # (1, E * per_head, E)


@pytest.mark.parametrize("E, k", [(4, 1), (6, 2), (5, 3)])
@pytest.mark.parametrize("scale", [0.1, 1.0, 8.0])
def test_loss_at_balanced_load_equals_its_minimum_k(E, k, scale):
    """At balanced load f_i = k/E the loss E sum_i f_i P_i is k whatever the probabilities; unbalancing
    the same router raises it, and a zero router (uniform P) gives k too."""
    layer, tokens = _balanced_router(E, k, per_head=3, scale=scale)
    s = vm.train_router(layer, steps=0, tokens=tokens).state
    torch.testing.assert_close(s.load, torch.full((E,), k / E, dtype=torch.float64))
    assert s.imbalance == pytest.approx(0.0, abs=1e-6)
    assert s.loss == pytest.approx(k, rel=1e-6)
    unbalanced = tokens.clone()
    unbalanced[..., 0] += 2.0  # every token now also likes head 0
    s_unbalanced = vm.train_router(layer, steps=0, tokens=unbalanced).state
    assert s_unbalanced.imbalance > 0.1
    assert s_unbalanced.loss > k + 0.05
    with torch.no_grad():
        layer.wg.weight.zero_()
    assert vm.train_router(layer, steps=0, tokens=unbalanced).state.loss == pytest.approx(k, rel=1e-6)


def test_training_the_router_lowers_the_loss_and_evens_out_the_load():
    s = vm.compute_routing(seed=0)
    before = {name: p.detach().clone() for name, p in s.module.named_parameters()}
    run = vm.train_router(s, steps=60, lr=0.01)
    assert run.losses.shape == (61,) and run.loads.shape == (61, s.routed) and run.imbalances.shape == (61,)
    assert run.losses[0] == pytest.approx(s.loss, rel=1e-5)
    np.testing.assert_allclose(run.loads[0], s.load.numpy())
    np.testing.assert_allclose(run.loads.sum(axis=1), s.top_k, rtol=1e-6)
    assert s.imbalance > 0.3, "the default state should start visibly unbalanced"
    assert run.losses[-1] < s.loss - 1.0
    assert run.imbalances[-1] < s.imbalance / 4
    assert run.state.loss == pytest.approx(run.losses[-1]) and run.state.step == 60
    # only the copy moved, and only W_r (wg): the loss depends on no other weight
    after = dict(run.state.module.named_parameters())
    for name, p in before.items():
        assert torch.equal(p, dict(s.module.named_parameters())[name]), f"{name} of the input changed"
        moved = not torch.equal(p, after[name])
        assert moved == (name == "wg.weight"), f"{name}: moved={moved}"


def test_training_continues_from_a_trained_state():
    s = vm.compute_routing(seed=1)
    first = vm.train_router(s, steps=5)
    second = vm.train_router(first.state, steps=5)
    both = first.then(second)
    assert second.state.step == 10 and both.steps == 10
    assert both.losses[5] == pytest.approx(second.losses[0], rel=1e-6)


def test_train_router_takes_a_module_after_a_training_forward():
    """A training forward leaves a graph-attached loss on the layer; the copy must not trip over it."""
    layer = attnbook.MoHAttention(16, num_heads=4, shared_head=1, routed_head=2).train()
    x = torch.randn(2, 10, 16)
    layer(x).sum().backward()
    layer.qkv.weight.requires_grad_(False)  # a frozen weight stays frozen in the trained copy
    run = vm.train_router(layer, steps=3, tokens=x)
    assert run.losses.shape == (4,) and run.state.step == 3
    assert run.state.module is not layer
    flags = {name: p.requires_grad for name, p in run.state.module.named_parameters()}
    assert flags == {name: p.requires_grad for name, p in layer.named_parameters()}
    assert not flags["qkv.weight"] and flags["wg.weight"]


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: vm.train_router(vm.compute_routing(4, 4, 0, n_tokens=8)), "every head is shared"),
        (lambda: vm.train_router(attnbook.MoHAttention(8, 2, routed_head=1)), r"tokens of shape \(B, N, C\)"),
        (lambda: vm.train_router(torch.nn.Linear(2, 2)), "expected a RoutingState or an MoHAttention"),
        (lambda: vm.train_router(vm.compute_routing(n_tokens=8), steps=-1), "steps >= 0"),
        (lambda: vm.compute_routing(4, 2, 3), r"top_k must be in 1..2"),
        (lambda: vm.compute_routing(4, 4, 1), "nothing to route"),
        (lambda: vm.compute_routing(4, 5, 0), "shared must be in 0..n_heads=4"),
        (lambda: vm.compute_routing(4, 0, 0), r"top_k must be in 1..4"),
        (lambda: vm.compute_routing(temperature=0.0), "temperature must be positive"),
    ],
    ids=[
        "all_shared",
        "module_without_tokens",
        "not_moh",
        "negative_steps",
        "top_k_too_big",
        "top_k_without_routed",
        "too_many_shared",
        "top_k_zero",
        "zero_temperature",
    ],
)
def test_bad_arguments_raise(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_temperature_changes_the_gates_but_not_the_choice():
    """Dividing the router logits by T keeps their order, so the same heads win; only the weights move."""
    cold = vm.compute_routing(temperature=0.2, n_tokens=N_TOKENS)
    hot = vm.compute_routing(temperature=5.0, n_tokens=N_TOKENS)
    assert torch.equal(cold.selected, hot.selected)
    assert cold.routed_probs.max(dim=1).values.mean() > hot.routed_probs.max(dim=1).values.mean() + 0.2
    assert not torch.allclose(cold.gates, hot.gates)


def test_seed_reproduces_and_leaves_the_global_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    a = vm.compute_routing(seed=4, n_tokens=N_TOKENS)
    assert torch.equal(torch.rand(3), expected)
    b = vm.compute_routing(seed=4, n_tokens=N_TOKENS)
    c = vm.compute_routing(seed=5, n_tokens=N_TOKENS)
    assert torch.equal(a.gates, b.gates) and not torch.equal(a.gates, c.gates)


def test_load_imbalance_counts_the_choices_that_must_move():
    assert vm.load_imbalance(torch.tensor([0.5, 0.5, 0.5, 0.5]), 2) == pytest.approx(0.0)
    assert vm.load_imbalance(torch.tensor([1.0, 1.0, 0.0, 0.0]), 2) == pytest.approx(0.5)
    assert vm.load_imbalance(torch.tensor([1.0, 0.0, 0.0]), 1) == pytest.approx(2 / 3)
    assert vm.load_imbalance(torch.zeros(0), 0) == 0.0


@pytest.mark.parametrize("config", [CONFIGS["default"], CONFIGS["all_shared"]], ids=["default", "all_shared"])
def test_plot_routing_returns_a_figure_with_the_loss_in_the_title(config):
    s = vm.compute_routing(*config, n_tokens=N_TOKENS, dim=16)
    fig = vm.plot_routing(s)
    assert isinstance(fig, Figure) and len(fig.axes) == 4  # three panels and the gate colour bar
    assert f"load-balancing loss {s.loss:.3f}" in fig._suptitle.get_text()
    assert fig.axes[0].images[0].get_array().shape == (24, config[0])
    assert fig._repr_png_().startswith(b"\x89PNG")  # displays itself, no pyplot backend needed


def test_plot_with_history_adds_the_training_panel_and_frames_are_figures():
    s = vm.compute_routing(n_tokens=N_TOKENS)
    run = vm.train_router(s, steps=4)
    fig = vm.plot_routing(run.state, run)
    assert len(fig.axes) == 6  # + training panel and its twin axis
    assert len(fig.axes[3].get_lines()[0].get_ydata()) == 5
    assert isinstance(vm.default_figure(), Figure)
    frames = vm.training_frames(s, clicks=2, steps_per_click=3)
    assert list(frames) == ["0", "3", "6"]
    assert all(isinstance(f, Figure) for f in frames.values())


def test_explorer_builds_and_its_controls_and_buttons_rerender():
    box = vm.routing_explorer(n_tokens=32, steps_per_click=3)
    assert isinstance(box, widgets.VBox) and isinstance(box, vm.RoutingExplorer)
    ex = box.explorer
    assert ex.renders == 1 and ex.state.step == 0 and ex.history is None
    assert "loss" in ex.status.value

    ex.train.click()
    assert ex.renders == 2 and ex.state.step == 3 and ex.history.steps == 3
    ex.train.click()
    assert ex.renders == 3 and ex.state.step == 6 and ex.history.steps == 6

    ex.top_k.value = 3
    assert ex.renders == 4 and ex.state.top_k == 3 and ex.state.step == 0 and ex.history is None

    ex.temperature.value = 3.0
    assert ex.renders == 5 and ex.state.temperature == pytest.approx(3.0)

    ex.heads.value = 4  # 2 shared leave 2 routed: top-k is clamped to 2
    assert ex.renders == 6 and (ex.state.n_heads, ex.top_k.max, ex.top_k.value, ex.state.top_k) == (4, 2, 2, 2)

    ex.shared.value = 4  # everything shared: nothing to route or train
    assert (ex.top_k.min, ex.top_k.max, ex.state.top_k) == (0, 0, 0)
    assert ex.train.disabled and "nothing to route" in ex.status.value
    ex.shared.value = 1  # routed heads again: top-k back to at least 1
    assert (ex.top_k.min, ex.top_k.max, ex.state.top_k) == (1, 3, 1) and not ex.train.disabled

    ex.train.click()
    assert ex.state.step == 3
    ex.reset.click()
    assert ex.state.step == 0 and ex.history is None
    assert ex.renders == 10
