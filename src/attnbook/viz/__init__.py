"""Figures and widgets. Pure ``compute_*`` functions (tested) feed matplotlib views and ipywidgets
explorers; every widget also has a static figure of its default state for the website.

They need the book's extra, ``pip install 'attnbook[book]'`` (numpy, matplotlib, ipywidgets); the library
itself needs torch only."""

from .._checks import check_extra

check_extra(("numpy", "matplotlib", "ipywidgets"), extra="book", name="attnbook.viz")

from .flow import compute_flow_state, flow_explorer, make_toy_input, plot_flow
from .linear import attention_maps_figure, feature_error_plot, relative_error, row_entropy
from .moh import compute_routing, plot_routing, routing_explorer, train_router
from .plots import attention_heatmap, scaling_plot
from .static import frame_slider
from .style import COLOURS, book_style, colour, line_style, shared_scale

__all__ = ["attention_heatmap", "scaling_plot", "frame_slider", "attention_maps_figure", "feature_error_plot"]
__all__ += ["relative_error", "row_entropy", "compute_routing", "train_router", "plot_routing", "routing_explorer"]
__all__ += ["make_toy_input", "compute_flow_state", "plot_flow", "flow_explorer"]
__all__ += ["COLOURS", "colour", "line_style", "book_style", "shared_scale"]
