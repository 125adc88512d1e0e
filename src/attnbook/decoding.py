"""Deprecated: attnbook 0.2.0's preallocated decoder; :meth:`attnbook.lm.DecoderLM.generate` and
:meth:`attnbook.lm.DecoderLM.step` are the decoders now. :class:`StaticDecoder` keeps 0.2.0's calls working on top of
each layer's own ``step``.
"""

from __future__ import annotations

import warnings

import torch

from ._checks import check_bool, check_instance, check_int
from .lm import DecoderLM, LMState

__all__ = ["StaticDecoder"]


class StaticDecoder:
    """Deprecated since attnbook 0.3.0: generate with :meth:`DecoderLM.generate`, or prefill with
    ``model(prompt, output_final_state=True)`` and step with :meth:`DecoderLM.step`.

    ``prefill(tokens)`` and ``step(token)`` give 0.2.0's logits; ``compile=True`` compiles the step; ``batch``,
    ``capacity`` and ``native`` are checked and otherwise ignored (nothing is preallocated any more).

    Example:
        >>> import torch, warnings
        >>> from attnbook.lm import DecoderLM
        >>> from attnbook.decoding import StaticDecoder
        >>> model = DecoderLM("linear", dim=32, n_heads=4).eval()
        >>> tokens = torch.randint(0, 256, (1, 10))
        >>> with warnings.catch_warnings(record=True):  # a FutureWarning: deprecated
        ...     decoder = StaticDecoder(model, batch=1, capacity=64)
        >>> _ = decoder.prefill(tokens[:, :9])
        >>> torch.allclose(decoder.step(tokens[:, 9]), model(tokens)[:, 9], atol=1e-4)
        True
    """

    native = False  # there is no native step any more

    def __init__(
        self,
        model: DecoderLM,
        *,
        batch: int = 1,
        capacity: int = 4096,
        compile: bool = False,
        native: bool | None = None,
    ):
        name = "StaticDecoder"
        warnings.warn(
            f"{name} is deprecated since attnbook 0.3.0: use DecoderLM.generate, or model(prompt, "
            "output_final_state=True) and DecoderLM.step",
            FutureWarning,
            stacklevel=2,
        )
        self.model = check_instance(model, "model", DecoderLM, name=name, what="a DecoderLM")
        self.batch = check_int(batch, "batch", name=name, minimum=1)
        self.capacity = check_int(capacity, "capacity", name=name, minimum=1)
        compile = check_bool(compile, "compile", name=name)
        if native is not None:
            check_bool(native, "native", name=name)
        self._step = torch.compile(model.step, dynamic=True) if compile else model.step
        self._state = model.initial_state()

    @property
    def t(self) -> int:
        """The tokens seen."""
        return self._state.t

    @torch.no_grad()
    def prefill(self, tokens: torch.Tensor) -> torch.Tensor:
        """The logits (B, N, V) of a prompt (B, N), whose state the next :meth:`step` continues."""
        logits, self._state = self.model(tokens, output_final_state=True)
        return logits  # type: ignore[no-any-return]  # DecoderLM.forward's result is typed Any

    @torch.no_grad()
    def step(self, token: torch.Tensor) -> torch.Tensor:
        """The logits (B, V) after ``token`` (B,)."""
        logits, self._state = self._step(token, self._state)
        return logits

    def state(self) -> LMState:
        """The state held, as :meth:`DecoderLM.step` takes it."""
        return self._state

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor of the state held."""

        def leaves(x: object) -> list[torch.Tensor]:
            if isinstance(x, torch.Tensor):
                return [x]
            return [leaf for item in x for leaf in leaves(item)] if isinstance(x, tuple) else []

        return leaves(self._state.layers)
