"""The head-routing explorer (attnbook.viz.moh): compute functions, figures and the live widget."""

import ipywidgets as widgets
import numpy as np
import pytest
import torch
from matplotlib.figure import Figure
from test_viz_static import assert_readable

import attnbook
from attnbook.viz import moh as vm
from attnbook.viz.style import colour

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


BAD_CALLS = {  # id -> (call, error, message)
    "all_shared": (
        lambda: vm.train_router(vm.compute_routing(4, 4, 0, n_tokens=8)),
        ValueError,
        "^train_router: the layer must have routed heads",
    ),
    "module_without_tokens": (
        lambda: vm.train_router(attnbook.MoHAttention(8, 2, routed_head=1)),
        TypeError,
        r"^train_router: tokens must be a \(B, N, C\) tensor",
    ),
    "tokens_of_two_dims": (
        lambda: vm.train_router(attnbook.MoHAttention(8, 2, routed_head=1), tokens=torch.zeros(3, 8)),
        ValueError,
        r"^train_router: tokens must have 3 dimensions \(B, N, C\)",
    ),
    "not_moh": (lambda: vm.train_router(torch.nn.Linear(2, 2)), TypeError, "must be a RoutingState or an MoHAttention"),
    "negative_steps": (lambda: vm.train_router(vm.compute_routing(n_tokens=8), steps=-1), ValueError, "steps must be"),
    "fractional_steps": (lambda: vm.train_router(vm.compute_routing(n_tokens=8), steps=2.5), TypeError, "steps must"),
    "zero_lr": (lambda: vm.train_router(vm.compute_routing(n_tokens=8), lr=0.0), ValueError, "lr must be a finite"),
    "nan_lr": (lambda: vm.train_router(vm.compute_routing(n_tokens=8), lr=float("nan")), ValueError, "lr must be"),
    "string_lr": (lambda: vm.train_router(vm.compute_routing(n_tokens=8), lr="0.1"), TypeError, "lr must be a number"),
    "top_k_too_big": (lambda: vm.compute_routing(4, 2, 3), ValueError, "routed_head must be at most"),
    "top_k_without_routed": (lambda: vm.compute_routing(4, 4, 1), ValueError, "only 4"),
    "too_many_shared": (lambda: vm.compute_routing(4, 5, 0), ValueError, "shared_head must be at most num_heads"),
    "top_k_zero": (lambda: vm.compute_routing(4, 0, 0), ValueError, "no head would ever be used"),
    "no_heads": (lambda: vm.compute_routing(0, 0, 0), ValueError, "num_heads must be an int >= 1, got 0"),
    "fractional_heads": (lambda: vm.compute_routing(8.0), TypeError, "num_heads must be an int, got 8.0"),
    "bool_shared": (lambda: vm.compute_routing(8, True), TypeError, "shared_head must be an int, got True"),
    "zero_temperature": (lambda: vm.compute_routing(temperature=0.0), ValueError, "temperature must be a finite"),
    "nan_temperature": (lambda: vm.compute_routing(temperature=float("nan")), ValueError, "temperature must be"),
    "string_temperature": (lambda: vm.compute_routing(temperature="1"), TypeError, "temperature must be a number"),
    "no_tokens": (lambda: vm.compute_routing(n_tokens=0), ValueError, "n_tokens must be an int >= 1, got 0"),
    "fractional_dim": (lambda: vm.compute_routing(dim=31.5), TypeError, "dim must be an int"),
    "negative_seed": (lambda: vm.compute_routing(seed=-2), ValueError, "seed must be an int >= 0"),
    "nan_offset": (lambda: vm.compute_routing(offset=float("nan")), ValueError, "offset must be a finite number"),
    "plot_not_a_state": (lambda: vm.plot_routing("state"), TypeError, "^plot_routing: state must be a RoutingState"),
    "plot_zero_tokens": (
        lambda: vm.plot_routing(vm.compute_routing(n_tokens=8), max_tokens=0),
        ValueError,
        "max_tokens must be an int >= 1",
    ),
    "frames_no_steps": (lambda: vm.training_frames(steps_per_click=0), ValueError, "steps_per_click must be"),
    "explorer_no_tokens": (lambda: vm.routing_explorer(n_tokens=0), ValueError, "^routing_explorer: n_tokens must"),
    "explorer_nan_lr": (lambda: vm.routing_explorer(lr=float("nan")), ValueError, "^routing_explorer: lr must"),
    "explorer_float_steps": (lambda: vm.routing_explorer(steps_per_click=1.5), TypeError, "steps_per_click must"),
    "train_not_a_state": (
        lambda: vm.train_router("state"),
        TypeError,
        "^train_router: state_or_module must be a RoutingState or an MoHAttention, got 'state'",
    ),
    "train_state_and_tokens": (
        lambda: vm.train_router(vm.compute_routing(n_tokens=4), tokens=torch.zeros(1, 4, 32)),
        ValueError,
        r"^train_router: tokens must be None when a RoutingState is given \(its tokens are used\), got a float32",
    ),
    "train_module_without_tokens": (
        lambda: vm.train_router(attnbook.MoHAttention(16, num_heads=4, shared_head=1, routed_head=2)),
        TypeError,
        r"^train_router: tokens must be a \(B, N, C\) tensor with a module, got None",
    ),
    "train_no_routed_heads": (
        lambda: vm.train_router(vm.compute_routing(4, 4, 0, n_tokens=4)),
        ValueError,
        r"^train_router: the layer must have routed heads \(shared_head < num_heads\) to have a router to train, "
        "got num_heads=4, shared_head=4",
    ),
    "plot_bad_history": (
        lambda: vm.plot_routing(vm.compute_routing(n_tokens=4), history=[1]),
        TypeError,
        "^plot_routing: history must be a RouterTraining or None, got a list of length 1",
    ),
    "frames_not_a_state": (
        lambda: vm.training_frames("state"),
        TypeError,
        "^training_frames: state must be a RoutingState or None, got 'state'",
    ),
}


@pytest.mark.parametrize("call, error, message", BAD_CALLS.values(), ids=BAD_CALLS.keys())
def test_bad_arguments_raise_naming_them(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_head_rules_are_moh_s_own():
    """compute_routing applies check_moh_heads (the rules MoHAttention applies), naming its own arguments."""
    with pytest.raises(ValueError, match=r"^compute_routing \(n_heads, shared, top_k are MoH's num_heads"):
        vm.compute_routing(4, 2, 3)
    for H, S, K in [(4, 2, 3), (4, 0, 0), (4, 4, 1)]:
        with pytest.raises(ValueError) as layer_error:
            attnbook.MoHAttention(16, num_heads=H, shared_head=S, routed_head=K)
        with pytest.raises(ValueError) as widget_error:
            vm.compute_routing(H, S, K, n_tokens=4, dim=16)
        assert str(widget_error.value).split(": ", 1)[1] == str(layer_error.value).split(": ", 1)[1]


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
    assert isinstance(fig, Figure) and len(fig.axes) == 6  # four panels, the gate colour bar, the twin axis
    assert f"load-balancing loss {s.loss:.3f}" in fig._suptitle.get_text()
    assert fig.axes[0].images[0].get_array().shape == (24, config[0])
    assert fig._repr_png_().startswith(b"\x89PNG")  # displays itself, no pyplot backend needed


def test_plot_with_history_adds_the_training_panel_and_frames_are_figures():
    s = vm.compute_routing(n_tokens=N_TOKENS)
    run = vm.train_router(s, steps=4)
    fig = vm.plot_routing(run.state, run)
    assert len(fig.axes) == 6  # the training panel and its twin axis are there with or without history
    assert len(fig.axes[3].get_lines()[0].get_ydata()) == 5
    assert len(vm.plot_routing(s).axes[3].get_lines()[0].get_ydata()) == 1  # untrained: step 0 only
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


@pytest.mark.parametrize(
    "config, trained",
    [(CONFIGS["default"], False), (CONFIGS["default"], True), (CONFIGS["all_shared"], False), ((12, 1, 11), True)],
    ids=["default", "trained", "all_shared", "twelve_heads_trained"],
)
def test_routing_figures_fit_the_page(config, trained):
    """PAGE_WIDTH wide, text >= MIN_FONT, four panels on two rows that keep their width whether or not the
    router has been trained, and the training panel's legend covers no curve (it covers no panel at all)."""
    s = vm.compute_routing(*config, n_tokens=N_TOKENS, dim=16)
    history = vm.train_router(s, steps=5) if trained and s.routed else None
    state = history.state if history else s
    fig = vm.plot_routing(state, history, next_steps=10)
    assert_readable(fig)
    widths = [ax.get_position().width for ax in fig.axes[:2]]
    untrained = vm.plot_routing(s)
    assert [ax.get_position().width for ax in untrained.axes[:2]] == pytest.approx(widths), "the 4th panel squeezes"


def test_routed_heads_wear_moh_s_colour():
    fig = vm.plot_routing(vm.compute_routing(n_tokens=N_TOKENS, dim=16))
    bars = fig.axes[2].patches
    import matplotlib.colors as mc

    assert mc.to_hex(bars[-1].get_facecolor()) == colour("moh").lower()


def test_explorer_draws_png_into_an_image_widget():
    """Not an Output widget: that one stays empty in the classic notebook with ipywidgets 7.7.1 (Colab's)."""
    box = vm.routing_explorer(n_tokens=32)
    kinds = set()
    stack = [box]
    while stack:
        w = stack.pop()
        kinds.add(type(w).__name__)
        stack.extend(getattr(w, "children", ()))
    assert "Output" not in kinds and "Image" in kinds
    assert bytes(box.explorer.image.value).startswith(b"\x89PNG")


def test_explorer_disables_what_cannot_act_and_says_why():
    ex = vm.routing_explorer(n_tokens=32, steps_per_click=3).explorer
    assert ex.reset.disabled and "<b>reset router</b> is greyed out: the router is untrained" in ex.status.value
    ex.train.click()
    assert not ex.reset.disabled
    ex.shared.value = ex.heads.value - 1  # one routed head: top-k can only be 1
    assert ex.top_k.disabled and "<b>routed h_r</b> is greyed out: there is one routed head" in ex.status.value
    ex.shared.value = ex.heads.value
    for name in ("top_k", "steps", "train"):
        assert ex.controls[name].disabled, name
    assert "<b>train router</b> is greyed out: all 8 heads are shared" in ex.status.value
    ex.shared.value = 2
    assert not any(ex.controls[n].disabled for n in ("top_k", "steps", "train", "shared", "heads"))


def test_steps_per_click_shows_in_the_figure_and_sets_the_next_click():
    ex = vm.routing_explorer(n_tokens=32, steps_per_click=3).explorer
    before = ex.image.value
    ex.steps.value = 7
    assert ex.image.value != before and ex.state.step == 0  # the training panel marks the next click's steps
    ex.train.click()
    assert ex.state.step == 7


def test_more_heads_widen_the_dependent_sliders():
    """shared's range is 0..H and top-k's 1..H - h_s; a changed range is a new slider (ipywidgets 8's End key)."""
    box = vm.routing_explorer(n_tokens=32)
    ex = box.explorer
    first = ex.shared
    ex.heads.value = 12
    assert ex.shared is not first and (ex.shared.min, ex.shared.max) == (0, 12)
    assert ex.shared in ex.column_left.children and first not in ex.column_left.children
    assert (ex.top_k.min, ex.top_k.max) == (1, 10)
    ex.shared.value = 12  # the new slider is observed
    assert ex.state.shared == 12 and (ex.top_k.min, ex.top_k.max) == (0, 0)


# --- quality against the fraction of heads (chapter 5, the MoH paper's claim) -------------------------------

RECORDING = {
    "curve": [
        {"fraction": 0.25, "accuracy": {"mean": 0.6, "low": 0.5, "high": 0.7}},
        {"fraction": 1.0, "accuracy": {"mean": 1.0, "low": 1.0, "high": 1.0}},
    ],
    "softmax": {"fraction": 1.0, "accuracy": {"mean": 0.99, "low": 0.98, "high": 1.0}},
}


def test_fraction_curve_reads_a_recording_and_a_live_study():
    rows, softmax = vm.fraction_curve(RECORDING)
    assert rows == [(0.25, 0.6, 0.5, 0.7), (1.0, 1.0, 1.0, 1.0)] and softmax == (0.99, 0.98, 1.0)
    assert vm.fraction_curve({**RECORDING, "softmax": None})[1] is None

    from attnbook.lab import claims

    task = claims.MultiKeyRecallTask(n_pairs=3, n_keys=4, n_values=2, n_queried=2)
    setup = claims.Setup(d_model=16, n_heads=4, n_layers=1, batch=8, steps=2, eval_every=1, eval_size=16)
    study = claims.moh_study(task, setup, splits=[(1, 1), (4, 0)], seeds=1)
    rows, softmax = vm.fraction_curve(study)
    assert [r[0] for r in rows] == [0.5, 1.0] and all(r[2] <= r[1] <= r[3] for r in rows)
    assert softmax is not None and softmax[1] <= softmax[0] <= softmax[2]
    with pytest.raises(ValueError, match="hold 'curve' and 'softmax'"):
        vm.fraction_curve({"curve": []})
    with pytest.raises(ValueError, match="a MoHStudy"):
        vm.fraction_curve(3)


def test_fraction_figure_draws_curves_softmax_chance_and_the_claim_for_the_page():
    rows, softmax = vm.fraction_curve(RECORDING)
    fig = vm.fraction_figure({"recorded": rows, "live": rows}, softmax=softmax, chance=0.04)
    assert_readable(fig)
    ax = fig.axes[0]
    labels = ax.get_legend_handles_labels()[1]
    assert labels[:3] == ["the paper's claim: 50%-90% of the heads", "multi-head softmax, every head", "chance"]
    assert labels[3:] == ["recorded", "live"]
    assert bytes(fig._repr_png_()).startswith(b"\x89PNG")  # shows itself in a notebook
    with pytest.raises(ValueError, match="curves must hold at least 1 curve"):
        vm.fraction_figure({})


def test_the_fewer_heads_control_is_read_from_a_recording_and_drawn_dashed_in_softmax_colour():
    import matplotlib.colors as mc

    assert vm.fewer_heads_curve(RECORDING) == []  # a study without the control
    control = {**RECORDING, "fewer_heads": [{"fraction": 0.25, "accuracy": {"mean": 0.9, "low": 0.8, "high": 1.0}}]}
    rows = vm.fewer_heads_curve(control)
    assert rows == [(0.25, 0.9, 0.8, 1.0)]
    fig = vm.fraction_figure({"recorded": vm.fraction_curve(control)[0]}, fewer=rows)
    assert_readable(fig)
    handles, labels = fig.axes[0].get_legend_handles_labels()
    line = handles[labels.index("recorded: plain attention, that many heads")].lines[0]
    assert mc.to_hex(line.get_color()) == colour("softmax").lower() and line.get_linestyle() == "--"
    with pytest.raises(ValueError, match="hold 'curve' and 'softmax'"):
        vm.fewer_heads_curve({"fewer_heads": []})
