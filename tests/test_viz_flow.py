"""The flow-allocation explorer (attnbook.viz.flow): its compute functions against the package and the float64
reference, and that its views build and react to their controls without a kernel."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from support import tol  # noqa: E402
from test_viz_static import assert_readable  # noqa: E402

import attnbook  # noqa: E402
from attnbook import reference  # noqa: E402
from attnbook.viz import flow as vf  # noqa: E402

F64 = tol(torch.float64)
MODES = {  # id -> keyword arguments of compute_flow_state
    "flow": dict(causal=False, heads_compete=False),
    "causal": dict(causal=True, heads_compete=False),
    "mobile": dict(causal=False, heads_compete=True),
}


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def package_output(q, k, v, *, causal, heads_compete):
    if heads_compete:
        return attnbook.mobile_attention(q, k, v, return_flows=True)
    return attnbook.flow_attention(q, k, v, is_causal=causal, return_flows=True)


# ---------------------------------------------------------------------------------------------- toy input


def test_toy_input_shapes_dtype_and_determinism():
    q, k, v = vf.make_toy_input(5, 0.4, 2.0, 3, seed=7)
    for x in (q, k, v):
        assert x.shape == (1, 3, 5, 4) and x.dtype == torch.float64
    again = vf.make_toy_input(5, 0.4, 2.0, 3, seed=7)
    other = vf.make_toy_input(5, 0.4, 2.0, 3, seed=8)
    assert all(torch.equal(a, b) for a, b in zip((q, k, v), again, strict=True))
    assert not torch.equal(q, other[0])


def test_toy_input_more_tokens_keep_the_earlier_ones():
    short = vf.make_toy_input(4, 0.3, 2.0, 2, seed=1)
    long = vf.make_toy_input(9, 0.3, 2.0, 2, seed=1)
    for a, b in zip(short, long, strict=True):
        torch.testing.assert_close(b[..., :4, :], a, **F64)


def test_toy_input_similarity_one_makes_identical_tokens_and_zero_does_not():
    q, k, v = vf.make_toy_input(6, 1.0, 2.0, 2)
    for x in (q, k, v):
        torch.testing.assert_close(x, x[..., :1, :].expand_as(x), **F64)
    q0, _, _ = vf.make_toy_input(6, 0.0, 2.0, 2)
    assert (q0 - q0[..., :1, :]).abs().amax() > 0.1


def test_toy_input_magnitude_scales_queries_and_keys_not_values():
    q1, k1, v1 = vf.make_toy_input(5, 0.5, 1.0, 2)
    q3, k3, v3 = vf.make_toy_input(5, 0.5, 3.0, 2)
    torch.testing.assert_close(q3, 3 * q1, **F64)
    torch.testing.assert_close(k3, 3 * k1, **F64)
    torch.testing.assert_close(v3, v1, **F64)


BAD_TOY_ARGUMENTS = {  # id -> (keyword arguments, error, message after "make_toy_input: ")
    "no_tokens": (dict(n_tokens=0), ValueError, r"n_tokens must be an int in 1\.\.64, got 0"),
    "negative_tokens": (dict(n_tokens=-3), ValueError, "n_tokens must be an int in 1..64"),
    "too_many_tokens": (dict(n_tokens=vf.MAX_TOKENS + 1), ValueError, "n_tokens must be an int in 1..64"),
    "fractional_tokens": (dict(n_tokens=2.5), TypeError, "n_tokens must be an int, got 2.5"),
    "string_tokens": (dict(n_tokens="6"), TypeError, "n_tokens must be an int, got '6'"),
    "bool_heads": (dict(n_heads=True), TypeError, "n_heads must be an int, got True"),
    "no_heads": (dict(n_heads=0), ValueError, "n_heads must be an int >= 1, got 0"),
    "similarity_above_1": (dict(similarity=1.5), ValueError, "similarity must be a finite number >= 0 and <= 1"),
    "similarity_below_0": (dict(similarity=-0.1), ValueError, "similarity must be a finite number >= 0"),
    "nan_similarity": (dict(similarity=float("nan")), ValueError, "similarity must be a finite number"),
    "string_similarity": (dict(similarity="0.3"), TypeError, "similarity must be a number"),
    "negative_magnitude": (dict(magnitude=-1.0), ValueError, "magnitude must be a finite number >= 0"),
    "inf_magnitude": (dict(magnitude=float("inf")), ValueError, "magnitude must be a finite number >= 0"),
    "tensor_magnitude": (dict(magnitude=torch.tensor(2.0)), TypeError, "magnitude must be a number"),
    "negative_seed": (dict(seed=-1), ValueError, "seed must be an int >= 0"),
    "float_seed": (dict(seed=1.0), TypeError, "seed must be an int"),
    "no_head_width": (dict(d_head=0), ValueError, "d_head must be an int >= 1"),
    "int_dtype": (dict(dtype=torch.int64), ValueError, "dtype must be a floating-point dtype, got torch.int64"),
    "string_dtype": (dict(dtype="float32"), TypeError, "dtype must be a torch.dtype, got 'float32'"),
}


@pytest.mark.parametrize("kwargs, error, message", BAD_TOY_ARGUMENTS.values(), ids=BAD_TOY_ARGUMENTS.keys())
def test_toy_input_rejects_bad_arguments_naming_them(kwargs, error, message):
    with pytest.raises(error, match=rf"^make_toy_input: {message}"):
        vf.make_toy_input(**kwargs)


# ------------------------------------------------------------------------------------ compute_flow_state


@pytest.mark.parametrize("mode", MODES.values(), ids=MODES.keys())
def test_state_shapes(mode):
    H, N = 3, 5
    s = vf.compute_flow_state(*vf.make_toy_input(N, 0.3, 2.0, H), **mode)
    assert (s.n_heads, s.n_sinks, s.n_sources) == (H, N, N)
    for field in ("incoming", "conserved_incoming", "allocation"):
        assert getattr(s, field).shape == (H, N), field
    for field in ("outgoing", "conserved_outgoing", "conserved_outgoing_raw", "competition"):
        assert getattr(s, field).shape == (H, N), field
    assert s.flow.shape == s.edges.shape == (H, N, N)
    assert s.output.shape == (H, N, 4)
    assert s.mode == ("mobile" if mode["heads_compete"] else "flow")
    assert (s.head_flow is not None) == mode["heads_compete"]


@pytest.mark.parametrize("mode", MODES.values(), ids=MODES.keys())
def test_edges_times_v_is_the_package_output_and_the_reference(mode):
    q, k, v = vf.make_toy_input(7, 0.2, 3.0, 3, seed=2)
    s = vf.compute_flow_state(q, k, v, **mode)
    out, _ = package_output(q, k, v, **mode)
    torch.testing.assert_close(s.edges @ v[0], out[0], **F64)
    torch.testing.assert_close(s.output, out[0], **F64)
    if mode["heads_compete"]:
        ref = reference.mobile_attention(q, k, v)
    else:
        ref = reference.flow_attention(q, k, v, is_causal=mode["causal"])
    torch.testing.assert_close(s.output, ref[0], **F64)


def test_edges_with_more_keys_than_queries():
    """Cross-attention (N != M): sources and sinks differ in number; edges @ v is still the output."""
    q = torch.randn(2, 3, 4, dtype=torch.float64) * 2
    k = torch.randn(2, 8, 4, dtype=torch.float64) * 2
    v = torch.randn(2, 8, 5, dtype=torch.float64)
    s = vf.compute_flow_state(q, k, v)
    assert s.edges.shape == (2, 3, 8)
    torch.testing.assert_close(s.output, reference.flow_attention(q[None], k[None], v[None])[0], **F64)


@pytest.mark.parametrize("mode", [MODES["flow"], MODES["causal"]], ids=["flow", "causal"])
def test_flow_rows_sum_to_one_before_the_two_factors(mode):
    """flow_ij = q~_i.k~_j / I_i (causal: / (I_i t_i)) is a normalised distribution over sources (up to eps)."""
    s = vf.compute_flow_state(*vf.make_toy_input(6, 0.3, 3.0, 2), **mode)
    sums = s.flow.sum(-1)
    torch.testing.assert_close(sums, torch.ones_like(sums), rtol=0, atol=1e-4)  # eps terms: ~eps N D


@pytest.mark.parametrize("mode", MODES.values(), ids=MODES.keys())
def test_competition_off_sets_it_to_one_and_equals_attention_on_v_over_competition(mode):
    """Competition does not depend on v, so ablating it equals the package run on v / c."""
    q, k, v = vf.make_toy_input(6, 0.2, 3.0, 3, seed=3)
    full = vf.compute_flow_state(q, k, v, **mode)
    off = vf.compute_flow_state(q, k, v, competition=False, **mode)
    assert torch.equal(off.competition, torch.ones_like(off.competition))
    torch.testing.assert_close(off.allocation, full.allocation, **F64)
    torch.testing.assert_close(off.edges, off.allocation[..., None] * off.flow, **F64)
    out, _ = package_output(q, k, v / full.competition[None, ..., None], **mode)
    torch.testing.assert_close(off.output, out[0], **F64)
    assert (off.output - full.output).abs().amax() > 1e-3, "the competition toggle changed nothing"


@pytest.mark.parametrize("mode", MODES.values(), ids=MODES.keys())
def test_allocation_off_sets_it_to_one_and_divides_the_output_by_it(mode):
    q, k, v = vf.make_toy_input(6, 0.2, 3.0, 3, seed=4)
    full = vf.compute_flow_state(q, k, v, **mode)
    off = vf.compute_flow_state(q, k, v, allocation=False, **mode)
    assert torch.equal(off.allocation, torch.ones_like(off.allocation))
    torch.testing.assert_close(off.competition, full.competition, **F64)
    torch.testing.assert_close(off.edges, off.flow * off.competition[:, None, :], **F64)
    torch.testing.assert_close(off.output, full.output / full.allocation[..., None], **F64)
    assert (off.output - full.output).abs().amax() > 1e-3, "the allocation toggle changed nothing"


def test_both_off_is_plain_normalised_linear_attention_with_sigmoid_features():
    q, k, v = vf.make_toy_input(5, 0.4, 2.0, 2, seed=5)
    s = vf.compute_flow_state(q, k, v, competition=False, allocation=False)
    qs, ks = torch.sigmoid(q[0]), torch.sigmoid(k[0])
    scores = qs @ ks.transpose(-2, -1)  # (H, N, M)
    expected = scores / scores.sum(-1, keepdim=True) @ v[0]
    torch.testing.assert_close(s.output, expected, rtol=1e-4, atol=1e-6)  # eps = 1e-6 in the normaliser


def test_causal_has_no_edges_from_future_sources_and_ignores_them():
    q, k, v = vf.make_toy_input(7, 0.3, 3.0, 2, seed=6)
    s = vf.compute_flow_state(q, k, v, causal=True)
    future = torch.ones(7, 7, dtype=torch.bool).triu(1)
    assert torch.equal(s.edges[:, future], torch.zeros_like(s.edges[:, future]))
    assert (s.edges[:, ~future] > 0).all()
    k2, v2 = k.clone(), v.clone()
    k2[..., 4:, :] += 5.0
    v2[..., 4:, :] -= 3.0
    s2 = vf.compute_flow_state(q, k2, v2, causal=True)
    torch.testing.assert_close(s2.edges[:, :4], s.edges[:, :4], **F64)
    torch.testing.assert_close(s2.output[:, :4], s.output[:, :4], **F64)
    assert (s2.output[:, 4:] - s.output[:, 4:]).abs().amax() > 1e-3


def test_mobile_mode_uses_head_wise_sums():
    """Head mode: I_hi normalises with the sum of k~ over the heads at position i, not over the sequence."""
    eps = 1e-6
    q, k, v = vf.make_toy_input(6, 0.3, 3.0, 4, seed=8)
    s = vf.compute_flow_state(q, k, v, heads_compete=True)
    qs, ks = torch.sigmoid(q[0]), torch.sigmoid(k[0])  # (H, N, D)
    head_total = ks.sum(0, keepdim=True)  # (1, N, D): over heads, same position
    torch.testing.assert_close(s.incoming, ((qs + eps) * (head_total + eps)).sum(-1), **F64)
    seq = vf.compute_flow_state(q, k, v)
    assert (s.incoming - seq.incoming).abs().amax() > 1e-2
    # the heads share each token's budget: sum over heads of the conserved outgoing flow is H (before clamp)
    per_token = s.conserved_outgoing_raw.sum(0)
    torch.testing.assert_close(per_token, torch.full_like(per_token, 4.0), rtol=0, atol=1e-4)
    # ... and the head-axis network at each token is normalised: each query head receives one unit
    sums = s.head_flow.sum(-1)  # (N, H)
    torch.testing.assert_close(sums, torch.ones_like(sums), rtol=0, atol=1e-4)  # eps terms: ~eps N D


def test_flow_mode_conserves_over_the_sequence():
    s = vf.compute_flow_state(*vf.make_toy_input(6, 0.3, 3.0, 2))
    total = s.conserved_outgoing_raw.sum(-1)  # (H,)
    torch.testing.assert_close(total, torch.full_like(total, 6.0), rtol=0, atol=1e-4)


def test_state_accepts_a_three_dimensional_input_and_float32():
    q, k, v = (x[0].float() for x in vf.make_toy_input(5, 0.3, 2.0, 2))
    s = vf.compute_flow_state(q, k, v)
    assert s.edges.dtype == torch.float64
    torch.testing.assert_close(
        s.output.float(), attnbook.flow_attention(q[None], k[None], v[None])[0], **tol(torch.float32)
    )


def test_state_rejects_bad_inputs():
    q, k, v = vf.make_toy_input(5, 0.3, 2.0, 2)
    with pytest.raises(TypeError, match="^compute_flow_state: causal must be True or False, got 'False'"):
        vf.compute_flow_state(q, k, v, causal="False")
    with pytest.raises(TypeError, match="^compute_flow_state: heads_compete must be True or False, got 1"):
        vf.compute_flow_state(q, k, v, heads_compete=1)
    with pytest.raises(ValueError, match="^compute_flow_state: eps must be a finite number >= 0, got inf"):
        vf.compute_flow_state(q, k, v, eps=float("inf"))
    with pytest.raises(TypeError, match="^compute_flow_state: q must be a torch.Tensor, got"):
        vf.compute_flow_state(q.tolist(), k, v)
    with pytest.raises(
        ValueError,
        match=r"^compute_flow_state: causal must be False with heads_compete=True \(Mobile-Attention has no causal",
    ):
        vf.compute_flow_state(q, k, v, causal=True, heads_compete=True)
    big = torch.zeros(1, 1, vf.MAX_TOKENS + 1, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match=rf"^compute_flow_state: q must have N <= {vf.MAX_TOKENS} \(.*toy sizes"):
        vf.compute_flow_state(big, k, v)
    with pytest.raises(ValueError, match=rf"^compute_flow_state: k must have M <= {vf.MAX_TOKENS} \(.*toy sizes"):
        vf.compute_flow_state(q, big, big)
    with pytest.raises(ValueError, match=r"^compute_flow_state: q must have shape \(H, N, D\) or \(1, H, N, D\), got"):
        vf.compute_flow_state(q[0, 0], k, v)
    with pytest.raises(ValueError, match=r"^compute_flow_state: v must have shape \(H, M, D\) or \(1, H, M, D\)"):
        vf.compute_flow_state(q, k, torch.cat([v, v]))
    with pytest.raises(ValueError, match="N == M"):  # from the package: Mobile pairs query i with key i
        vf.compute_flow_state(q, k[..., :3, :], v[..., :3, :], heads_compete=True)


# ---------------------------------------------------------------------------------------------- views


@pytest.mark.parametrize("mode", MODES.values(), ids=MODES.keys())
def test_plot_flow_returns_a_figure_with_one_line_per_visible_edge(mode):
    N = 5
    s = vf.compute_flow_state(*vf.make_toy_input(N, 0.3, 2.0, 3), **mode)
    fig = vf.plot_flow(s, head=1)
    assert isinstance(fig, Figure)
    assert len(fig.axes) == (4 if mode["heads_compete"] else 3)
    (edges,) = [c for c in fig.axes[0].collections if c.get_label() == "edges"]
    n_lines = len(edges.get_segments())
    if mode["causal"]:
        assert n_lines == N * (N + 1) // 2  # no line from a future source
    else:
        assert n_lines == N * N


def test_plot_flow_rejects_a_missing_head_and_a_wrong_object():
    s = vf.compute_flow_state(*vf.make_toy_input(4, 0.3, 2.0, 2))
    with pytest.raises(ValueError, match=r"^plot_flow: head must be an int in 0\.\.1, got 2"):
        vf.plot_flow(s, head=2)
    with pytest.raises(TypeError, match="^plot_flow: head must be an int, got 0.5"):
        vf.plot_flow(s, head=0.5)
    with pytest.raises(TypeError, match="^plot_flow: state must be a FlowPicture"):
        vf.plot_flow(s.edges)


@pytest.mark.parametrize(
    "overrides",
    [dict(), dict(heads_compete=True), dict(causal=True, competition=False), dict(n_tokens=12, n_heads=6, head=5)],
    ids=["flow", "mobile", "causal_ablated", "mobile_largest"],
)
def test_figures_fit_the_page(overrides):
    """Drawn for the book's column: PAGE_WIDTH wide, text >= MIN_FONT, panels wrap onto two rows instead of
    shrinking (head mode's four panels too), legends above their panels cover none of them."""
    if overrides.get("n_heads") == 6:
        overrides["heads_compete"] = True
    fig = vf.default_figure(**overrides)
    assert_readable(fig)
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert len(panels) == (4 if overrides.get("heads_compete") else 3)
    rows = {round(ax.get_position().y1, 2) for ax in panels}
    assert len(rows) == 2, "the panels wrap onto two rows"


def test_the_mechanism_colour_comes_from_the_palette():
    for mode in ("flow", "mobile"):
        fig = vf.default_figure(heads_compete=mode == "mobile")
        (edges,) = [c for c in fig.axes[0].collections if c.get_label() == "edges"]
        rgb = edges.get_colors()[0][:3]
        assert matplotlib.colors.to_hex(rgb) == attnbook.viz.colour(mode).lower()


def test_default_figure_and_frames():
    assert isinstance(vf.default_figure(), Figure)
    frames = vf.explorer_frames("similarity", [0.0, 0.5, 1.0])
    assert list(frames) == ["0", "0.5", "1"]
    assert all(isinstance(f, Figure) for f in frames.values())
    with pytest.raises(
        ValueError, match="^explorer_frames: parameter must be one of 'allocation', .*got 'temperature'"
    ):
        vf.explorer_frames("temperature", [1.0])
    with pytest.raises(
        ValueError, match=r"^default_figure: parameters must be among .*got unknown parameters \['temperature'\]"
    ):
        vf.default_figure(temperature=1.0)
    with pytest.raises(ValueError, match=r"^explorer_frames: values must hold at least 1 value, got 0 values"):
        vf.explorer_frames("n_heads", [])
    with pytest.raises(ValueError, match=r"^explorer_frames: n_heads must be an int >= 1, got 0"):
        vf.explorer_frames("n_heads", [2, 0])
    with pytest.raises(TypeError, match=r"^explorer_frames: values must be a sequence \(a list or a tuple\), got 3"):
        vf.explorer_frames("n_heads", 3)


def test_frames_feed_frame_slider():
    html = attnbook.viz.frame_slider(vf.explorer_frames("magnitude", [1.0, 4.0]), label="magnitude").data
    assert html.count("<img") == 2 and 'type="range"' in html


def test_summary_reports_the_conservation_sums():
    s = vf.compute_flow_state(*vf.make_toy_input(6, 0.3, 3.0, 2))
    text = vf.explorer_summary(s)
    assert f"{s.conserved_outgoing_raw[0].sum():.3f} (N = 6)" in text
    assert "clamp clips" in text
    mobile = vf.explorer_summary(vf.compute_flow_state(*vf.make_toy_input(6, 0.3, 3.0, 2), heads_compete=True))
    assert "(H = 2)" in mobile


# ------------------------------------------------------------------------------------------- the widget


def _walk(widget):
    yield widget
    for child in getattr(widget, "children", ()):
        yield from _walk(child)


def _find(box, cls_name, description=None):
    for w in _walk(box):
        if type(w).__name__ == cls_name and (description is None or w.description == description):
            return w
    raise AssertionError(f"no {cls_name} {description!r} in the explorer")


def test_explorer_builds_with_a_rendered_png():
    box = vf.flow_explorer()
    image = _find(box, "Image")
    assert image.value[:8] == b"\x89PNG\r\n\x1a\n"
    assert "Σ" in _find(box, "HTML").value
    for name in (
        "tokens",
        "similarity",
        "magnitude",
        "heads",
        "seed",
        "head shown",
        "competition",
        "allocation",
        "causal",
        "mode",
    ):
        assert any(getattr(w, "description", None) == name for w in _walk(box)), name


@pytest.mark.parametrize(
    "control, cls_name, new_value",
    [
        ("similarity", "FloatSlider", 0.9),
        ("magnitude", "FloatSlider", 5.0),
        ("tokens", "IntSlider", 4),
        ("heads", "IntSlider", 2),
        ("seed", "IntSlider", 3),
        ("head shown", "IntSlider", 2),
        ("competition", "Checkbox", False),
        ("allocation", "Checkbox", False),
        ("causal", "Checkbox", True),
        ("mode", "ToggleButtons", True),
    ],
    ids=lambda x: str(x),
)
def test_changing_a_control_re_renders(control, cls_name, new_value):
    box = vf.flow_explorer()
    image, summary = _find(box, "Image"), _find(box, "HTML")
    before_png, before_text = image.value, summary.value
    _find(box, cls_name, control).value = new_value
    assert image.value != before_png
    assert image.value[:4] == b"\x89PNG"
    if control in ("similarity", "magnitude", "tokens", "mode", "competition", "allocation"):
        assert summary.value != before_text


def test_mode_labels_name_both_mechanisms_and_have_room():
    mode = _find(vf.flow_explorer(), "ToggleButtons", "mode")
    assert [label for label, _ in mode.options] == ["Flow: tokens compete", "Mobile: heads compete"]
    assert mode.style.button_width == "190px"  # the default width cut the labels before "Flow" / "Mobile"


def test_head_mode_disables_causal_says_why_and_restores_the_choice():
    box = vf.flow_explorer(n_heads=4, head=3, causal=True)
    causal, mode = _find(box, "Checkbox", "causal"), _find(box, "ToggleButtons", "mode")
    mode.value = True
    assert causal.disabled and causal.value is False, "head mode is never causal: the box must not stay ticked"
    summary = _find(box, "HTML").value
    assert "H = 4" in summary and "<b>causal</b> is greyed out: Mobile-Attention has no causal form" in summary
    assert not box.explorer.state.causal
    mode.value = False
    assert not causal.disabled and causal.value is True, "the student's choice comes back"
    assert box.explorer.state.causal and "greyed out" not in _find(box, "HTML").value
    causal.value = False  # unticked in Flow mode stays unticked after a round trip
    mode.value = True
    mode.value = False
    assert causal.value is False


def test_more_heads_widen_the_head_shown_slider_and_fewer_clamp_it():
    """The range of "head shown" follows "heads"; a changed range is a new slider (ipywidgets 8's End key
    keeps a slider's first maximum), which the explorer observes and redraws from."""
    box = vf.flow_explorer(n_heads=4, head=3)
    heads = _find(box, "IntSlider", "heads")
    first = _find(box, "IntSlider", "head shown")
    heads.value = 6
    head = _find(box, "IntSlider", "head shown")
    assert head is not first and (head.min, head.max, head.value) == (0, 5, 3)
    assert box.explorer.controls["head"] is head
    before = _find(box, "Image").value
    head.value = 5
    assert _find(box, "Image").value != before and box.explorer.state is not None
    assert "head 5 of 6" in box.explorer.summary.value or box.explorer.params["head"] == 5
    heads.value = 2
    head = _find(box, "IntSlider", "head shown")
    assert (head.max, head.value) == (1, 1)
    heads.value = 1
    head = _find(box, "IntSlider", "head shown")
    assert head.disabled and "<b>head shown</b> is greyed out: there is only one head" in box.explorer.summary.value


def test_at_similarity_one_the_dead_controls_are_disabled_with_the_reason():
    box = vf.flow_explorer()
    _find(box, "FloatSlider", "similarity").value = 1.0
    c = box.explorer.controls
    assert {name for name, w in c.items() if w.disabled} == {"magnitude", "n_heads", "seed", "head", "competition"}
    summary = box.explorer.summary.value
    for label in ("magnitude", "heads", "seed", "head shown", "competition"):
        assert f"<b>{label}</b> is greyed out:" in summary, label
    assert "every token is the same vector" in summary
    _find(box, "FloatSlider", "similarity").value = 0.3
    assert not any(w.disabled for w in c.values())
    # in head mode the heads still differ: only competition (all ones) stays dead
    _find(box, "ToggleButtons", "mode").value = True
    _find(box, "FloatSlider", "similarity").value = 1.0
    assert {name for name, w in c.items() if w.disabled} == {"causal", "competition"}


def _picture(params):
    """What the figure shows for these explorer parameters (the drawn head's arrays, and all heads' shares)."""
    s = vf._state_from(params)
    h = params["head"]
    parts = [s.edges[h], s.competition[h], s.allocation[h], s.conserved_outgoing[h], s.conserved_incoming[h]]
    if s.mode == "mobile":
        parts.append(s.conserved_outgoing_raw)
    return parts


def _same(a, b):
    return all(x.shape == y.shape and bool((x - y).abs().max() < vf._INVISIBLE) for x, y in zip(a, b, strict=True))


ALTERNATIVES = {
    "n_tokens": [2, 6, 12],
    "similarity": [0.0, 0.3, 0.95, 1.0],
    "magnitude": [0.25, 2.0, 4.0],  # the explorer's range
    "n_heads": [1, 2, 4, 6],
    "seed": [0, 1],
    "competition": [True, False],
    "allocation": [True, False],
    "causal": [False, True],
    "heads_compete": [False, True],
}


@pytest.mark.parametrize("trial", range(40))
def test_inactive_controls_are_exactly_those_that_change_nothing(trial):
    """For a random state: every control inactive_controls() lists changes nothing whatever value it takes, and
    every other control has some value that changes the picture (so no control looks dead without a reason)."""
    import random

    rng = random.Random(trial)
    p = dict(vf.DEFAULTS)
    for name, values in ALTERNATIVES.items():
        p[name] = rng.choice(values)
    p["head"] = rng.randrange(p["n_heads"])
    if p["heads_compete"]:
        p["causal"] = False
    inactive = vf.inactive_controls(p, vf._state_from(p))
    base = _picture(p)
    for name in [*ALTERNATIVES, "head"]:
        if name == "causal" and p["heads_compete"]:
            assert name in inactive
            continue
        values = range(p["n_heads"]) if name == "head" else ALTERNATIVES[name]
        changed = False
        for value in values:
            if value == p[name]:
                continue
            q = {**p, name: value}
            if name == "n_heads":
                q["head"] = min(q["head"], value - 1)
            if name == "heads_compete" and value:
                q["causal"] = False
            changed |= not _same(base, _picture(q))
        assert changed == (name not in inactive), (name, p, inactive.get(name))


def test_frames_and_summaries_refuse_what_they_would_lose_or_misread():
    """Two values of one label (0.30000001 and 0.3 print as "0.3") made one frame; a head past the state's raised an
    IndexError, and head -1 showed the last head labelled "head -1"."""
    with pytest.raises(ValueError, match=r"^explorer_frames: values must be distinct as labels .*0.30000001 and 0.3"):
        vf.explorer_frames("similarity", [0.30000001, 0.3])
    state = vf.compute_flow_state(*vf.make_toy_input(6, 0.5, 1.0, 2, 0))
    for head in (2, -1):
        with pytest.raises(ValueError, match=r"^explorer_summary: head must be an int in 0\.\.1 \(the state's heads\)"):
            vf.explorer_summary(state, head=head)


@pytest.mark.parametrize(
    "overrides, error, message",
    [
        (dict(n_tokens=0), ValueError, "n_tokens must be an int in 1..64"),
        (dict(similarity=float("nan")), ValueError, "similarity must be a finite number"),
        (dict(n_heads=2.0), TypeError, "n_heads must be an int"),
        (dict(causal="yes"), TypeError, "causal must be True or False"),
        (dict(n_heads=2, head=2), ValueError, r"head must be an int in 0\.\.1"),
        (dict(colour="red"), ValueError, "unknown parameter"),
        # accepted, then moved silently by the sliders (1 -> 2 tokens, magnitude 1000 -> 4, seed 10**7 -> 20)
        (dict(n_tokens=1), ValueError, r"n_tokens must be an int in 2\.\.12 \(the slider's range\), got 1"),
        (dict(magnitude=1000.0), ValueError, r"magnitude must be a finite number >= 0.25 and <= 4 \(the slider's"),
        (dict(seed=10**7), ValueError, r"seed must be an int in 0\.\.20 \(the slider's range\)"),
        (dict(n_heads=100, head=50), ValueError, r"n_heads must be an int in 1\.\.6 \(the slider's range\)"),
    ],
    ids=[
        "no_tokens",
        "nan_similarity",
        "float_heads",
        "string_causal",
        "head_past_heads",
        "unknown",
        "one_token",
        "huge_magnitude",
        "large_seed",
        "many_heads",
    ],  # fmt: skip
)
def test_explorer_rejects_bad_starting_values(overrides, error, message):
    with pytest.raises(error, match=rf"^flow_explorer: .*{message}"):
        vf.flow_explorer(**overrides)


# ---------------------------------------------------------------------------------------------- chapter 3's figures


def test_weight_maps_share_one_scale_and_label_every_cell():
    a = torch.tensor([[0.5, 0.5], [0.2, 0.8]])
    b = torch.tensor([[0.9, 0.0], [0.1, 0.3]])
    fig = vf.weight_maps({"linear": a, "Flow": b}, row_sums=True, title="weights")
    assert_readable(fig, min_panel_width=1.5)
    panels = [ax for ax in fig.axes if ax.get_images()]
    assert len(panels) == 2
    clims = {im.get_clim() for ax in panels for im in ax.get_images()}
    assert len(clims) == 1 and clims.pop() == pytest.approx((0.0, 0.9))
    texts = [t.get_text() for t in panels[1].texts]
    assert "0.90" in texts and "0.00" not in texts  # an exact zero (masked) stays blank
    assert any(t.startswith("Σ ") for t in texts)
    one = vf.weight_maps({"only": torch.rand(3, 3)}, annotate=False)
    assert len([ax for ax in one.axes if ax.get_images()]) == 1 and not one.axes[0].texts
    with pytest.raises(ValueError, match="weight_maps"):
        vf.weight_maps({"vector": torch.rand(3)})
    with pytest.raises((TypeError, ValueError), match="weight_maps"):
        vf.weight_maps({})


def test_right_key_figure_draws_each_curve_the_bound_and_uniform():
    betas = [0.5, 1, 2, 4]
    shares = {"softmax": [0.1, 0.2, 0.5, 0.9], "elu + 1": [0.05] * 4, "sigmoid": [0.04] * 4, "Flow": [0.045] * 4}
    fig = vf.right_key_figure(
        betas, shares, mechanisms={"elu + 1": "linear", "sigmoid": "flow", "Flow": "flow"},
        bound=[0.1] * 4, uniform=1 / 24,
    )  # fmt: skip
    assert_readable(fig)
    ax = fig.axes[0]
    labels = [line.get_label() for line in ax.get_lines()]
    assert labels[:4] == list(shares) and "bound for Flow" in labels and any("uniform" in x for x in labels)
    flows = [line for line in ax.get_lines() if line.get_label() in ("sigmoid", "Flow")]
    assert flows[0].get_color() == flows[1].get_color() and flows[0].get_marker() != flows[1].get_marker()
    with pytest.raises((TypeError, ValueError), match="right_key_figure"):
        vf.right_key_figure([], shares)


def test_lookup_share_figure_shows_rescaled_live_and_recorded_per_shape():
    from attnbook.lab import claims

    live = [claims.lookup_share_demo(6, 8, steps=5, scales=(1, 16))]
    recorded = [dict(live[0].to_dict(), steps=1000, trained={"linear": 0.99, "flow": 0.7})]
    fig = vf.lookup_share_figure(live, recorded)
    assert_readable(fig)
    ax = fig.axes[0]
    assert len(ax.patches) == 6  # 2 mechanisms x (best rescaling, live, recorded)
    texts = [t.get_text() for t in ax.texts]
    assert "0.99" in texts and "0.70" in texts
    assert f"{max(live[0].rescaled['flow']):.2f}" in texts
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == ["best rescaling", "trained, 5 steps (live)", "trained, 1000 steps (recorded)"]
    alone = vf.lookup_share_figure(live)
    assert len(alone.axes[0].patches) == 4
    with pytest.raises((TypeError, ValueError), match="lookup_share_figure"):
        vf.lookup_share_figure([])


def test_clamp_figure_counts_the_cut_share_per_setting():
    samples = {"N = M": torch.tensor([0.5, 0.9, 1.1, 1.5]), "N > M": torch.tensor([2.0, 3.0, 4.0, 0.5])}
    fig = vf.clamp_figure(samples)
    assert_readable(fig)
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()] if fig.axes[0].get_legend() else []
    legend += [t.get_text() for leg in fig.legends for t in leg.get_texts()]
    assert "N = M: 50% cut" in legend and "N > M: 75% cut" in legend and "clamp at 1" in legend
    with pytest.raises((TypeError, ValueError), match="clamp_figure"):
        vf.clamp_figure({})


def test_accuracy_figure_draws_live_and_recorded_bars_with_their_ranges():
    rows = [
        ("softmax", "softmax", (0.31, 0.30, 0.32), (0.309, 0.299, 0.319)),
        ("Flow", "flow", (0.30, 0.29, 0.31), None),
        ("linear", "linear", None, (0.306, 0.30, 0.314)),
    ]
    fig = vf.accuracy_figure(rows, chance=0.1, majority=0.114)
    assert_readable(fig)
    ax = fig.axes[0]
    assert len(ax.patches) == 4  # two bars, one, one
    widths = sorted(round(p.get_width(), 3) for p in ax.patches)
    assert widths == [0.3, 0.306, 0.309, 0.31]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["linear", "Flow", "softmax"]
    legend = [t.get_text() for leg in [ax.get_legend(), *fig.legends] if leg for t in leg.get_texts()]
    assert {"live run", "recorded", "chance 0.10", "majority class 0.11"} <= set(legend)
    with pytest.raises((TypeError, ValueError), match="accuracy_figure"):
        vf.accuracy_figure([])


def test_chapter_figures_are_closed_so_a_notebook_shows_each_once():
    figs = [
        vf.weight_maps({"a": torch.rand(2, 2)}),
        vf.right_key_figure([1, 2], {"softmax": [0.1, 0.2]}),
        vf.clamp_figure({"N = M": torch.tensor([0.5, 1.5])}),
        vf.accuracy_figure([("softmax", "softmax", (0.3, 0.2, 0.4), None)]),
    ]
    for fig in figs:
        assert not plt.fignum_exists(fig.number)
        assert_readable(fig)  # a closed figure still renders
