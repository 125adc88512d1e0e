"""A small decoder-only language model whose attention is chosen by name: chapter 7.

The pre-norm decoder of GPT-2 (Radford et al. 2019) at toy size: token embeddings plus fixed sinusoidal positions
(Vaswani et al., NeurIPS 2017), ``n_layers`` blocks of causal self-attention and a two-layer MLP, each on a
residual path behind a LayerNorm, a final LayerNorm and a head tied to the embeddings. Every block builds its
attention from the registry, ``MECHANISMS[name].module(dim, n_heads, causal=True)``, so mechanisms are swapped by
one string.

Generation prefills the prompt in one parallel call (``forward(prompt, output_final_state=True)``), then runs one
token at a time (:meth:`DecoderLM.step`), carrying each layer's own state: a **recurrent state** of constant size
(linear attention is an RNN, Flow-Attention keeps its prefix sums) or a **KV cache** (softmax attention, MoH)
that grows by one row per token. Per generated token at position t and layer, width C = H D: O(C^2) for the
projections and the MLP, plus O(t C) time and 2 t C numbers for a KV cache, or O(H D^2) for a recurrent state.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, NamedTuple, cast

import torch
import torch.nn.functional as F
from torch import nn

from . import mechanisms
from ._checks import (
    check_bool,
    check_choice,
    check_count,
    check_divisible,
    check_instance,
    check_int,
    check_number,
    check_same_value,
    check_token_ids,
)
from ._runtime import accumulation_dtype, tracing
from .softmax import KVCache

# KVCache is imported here for code written for 0.1 (attnbook.lm.KVCache); it is documented as attnbook.KVCache
__all__ = ["DecoderLM", "Block", "LMState", "sinusoidal_positions", "state_bytes"]


def sinusoidal_positions(positions: torch.Tensor, dim: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Fixed sinusoidal position vectors (Vaswani et al. 2017) for (N,) integer positions -> (N, C), C = ``dim``.

    ``P[t, 2i] = sin(t / 10000^(2i / C))``, ``P[t, 2i + 1] = cos(t / 10000^(2i / C))`` (an odd C drops the last
    cosine), computed in at least float32 and returned in ``dtype`` (default: that accumulation dtype).

    Example:
        >>> import torch
        >>> from attnbook.lm import sinusoidal_positions
        >>> P = sinusoidal_positions(torch.arange(4), dim=6)
        >>> tuple(P.shape), P[0].tolist()  # position 0: sin 0 = 0, cos 0 = 1
        ((4, 6), [0.0, 1.0, 0.0, 1.0, 0.0, 1.0])
    """
    dim = check_int(dim, "dim", name="sinusoidal_positions", minimum=1)
    acc = accumulation_dtype(dtype or torch.float32)
    t = positions.to(acc).unsqueeze(-1)  # (N, 1)
    i = torch.arange(0, dim, 2, device=positions.device, dtype=acc)  # (ceil(C / 2),)
    angle = t * torch.exp(i * (-math.log(10000.0) / dim))  # (N, ceil(C / 2))
    out = torch.stack([angle.sin(), angle.cos()], dim=-1).flatten(-2)[..., :dim]  # (N, C)
    return out if dtype is None else out.to(dtype)


class LMState(NamedTuple):
    """Everything :meth:`DecoderLM.step` needs about the past: ``t``, the number of tokens seen (the next token's
    position), and ``layers``, per block its layer's state (a :class:`KVCache`, :class:`attnbook.LinearState`, ...).

    Example:
        >>> import torch
        >>> from attnbook.lm import DecoderLM
        >>> model = DecoderLM("softmax", dim=32, n_heads=4, n_layers=2)
        >>> _, state = model(torch.randint(0, 256, (1, 5)), output_final_state=True)
        >>> state.t, [type(layer).__name__ for layer in state.layers]
        (5, ['KVCache', 'KVCache'])
    """

    t: int
    layers: tuple[Any, ...]  # per block its layer's state: a KVCache, LinearState or FlowState (or None)


def state_bytes(state: Any, *, allocated: bool = False) -> int:
    """Bytes held by a decoding state (an :class:`LMState`, one layer's state, or nested tuples of them): the numbers
    held (a :class:`KVCache` of t tokens: 2 t H D per layer), or with ``allocated=True`` the storage behind them.

    Example:
        >>> import torch
        >>> from attnbook.lm import DecoderLM, state_bytes
        >>> tokens = torch.randint(0, 256, (1, 100))
        >>> for name in ("softmax", "linear"):  # a KV cache grows with t, a recurrent state does not
        ...     _, state = DecoderLM(name, dim=32, n_heads=4)(tokens, output_final_state=True)
        ...     print(name, state_bytes(state))
        softmax 51200
        linear 2304
    """
    if isinstance(state, torch.Tensor):
        return state.untyped_storage().nbytes() if allocated else state.numel() * state.element_size()
    if isinstance(state, KVCache):
        return state_bytes((state.keys, state.values), allocated=allocated)  # the padding flags aside
    if isinstance(state, tuple):
        return sum(state_bytes(s, allocated=allocated) for s in state)
    return 0  # ints (positions) and None


class Block(nn.Module):
    """Pre-norm transformer block: ``x + attn(LN(x))``, then ``x + MLP(LN(x))``, attention chosen by name.

    The one block of the book: chapter 7's decoder, and the encoders (``causal=False``) of chapter 6 and of the
    claims experiments. ``mechanism``: a name of :data:`attnbook.mechanisms.MECHANISMS`; the MLP is
    ``Linear(C, mlp_ratio C)``, GELU, ``Linear(mlp_ratio C, C)``; ``attn_options``: further keywords of the
    registry's module (an ablation such as ``competition=False``).

    Shape:
        ``forward(x, key_padding_mask=None)``: (B, N, C) -> (B, N, C); ``forward(x, initial_state,
        output_final_state=True)`` -> ((B, N, C), state); ``step(x_t, state)``: (B, C) -> ((B, C), new state),
        the state being the attention layer's own.

    Example:
        >>> import torch
        >>> from attnbook.lm import Block
        >>> block = Block("flow", dim=32, n_heads=4).eval()
        >>> x = torch.randn(2, 10, 32)
        >>> _, state = block(x[:, :9], output_final_state=True)  # prefill 9 tokens
        >>> y_t, state = block.step(x[:, 9], state)  # and the tenth
        >>> torch.allclose(y_t, block(x)[:, 9], atol=1e-5), block.recurrent
        (True, True)
    """

    def __init__(
        self,
        mechanism: str,
        dim: int,
        n_heads: int,
        mlp_ratio: int = 4,
        *,
        causal: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        **attn_options: Any,
    ):
        super().__init__()
        factory: dict[str, Any] = {"device": device, "dtype": dtype}
        self.mechanism = mechanisms.get(mechanism)
        self.norm1 = nn.LayerNorm(dim, **factory)
        self.attn = self.mechanism.module(dim, n_heads, causal=causal, **factory, **attn_options)
        self.norm2 = nn.LayerNorm(dim, **factory)
        hidden = mlp_ratio * dim
        self.mlp = nn.Sequential(nn.Linear(dim, hidden, **factory), nn.GELU(), nn.Linear(hidden, dim, **factory))

    @property
    def recurrent(self) -> bool:
        """True when generation carries a constant-size state, False when it keeps a KV cache."""
        return self.mechanism.step is not None

    def forward(
        self,
        x: torch.Tensor,
        initial_state: Any = None,
        output_final_state: bool = False,
        *,
        key_padding_mask: torch.Tensor | None = None,
    ) -> Any:
        h = self.norm1(x)
        if initial_state is None and not output_final_state:
            if key_padding_mask is None:
                x = x + self.attn(h)  # (B, N, C)
            else:
                x = x + self.attn(h, key_padding_mask=key_padding_mask)  # (B, N, C)
            return x + self.mlp(self.norm2(x))  # (B, N, C)
        a, state = self.attn(h, initial_state=initial_state, output_final_state=True, key_padding_mask=key_padding_mask)
        x = x + a  # (B, N, C)
        return x + self.mlp(self.norm2(x)), state  # (B, N, C)

    def initial_state(self) -> Any:
        """The state before the first token: None (every layer's step starts from nothing)."""
        return None

    def step(self, x_t: torch.Tensor, state: Any) -> tuple[torch.Tensor, Any]:
        """One token through the block: x_t (B, C) -> ((B, C), new state)."""
        a, state = self.attn.step(self.norm1(x_t), state)
        x_t = x_t + a  # (B, C)
        return x_t + self.mlp(self.norm2(x_t)), state  # (B, C)


class DecoderLM(nn.Module):
    """A small decoder-only language model, its attention chosen by name (chapter 7).

    ``logits = W_E LN(blocks(sqrt(C) E[x] + P))`` with E the token embeddings (tied to the head W_E), P the
    sinusoidal positions and L blocks (:class:`Block`). Cost of a forward over N tokens: O(N L C^2) plus the
    attention's own (O(N^2 C) for softmax and MoH, O(N C D) for linear and flow).

    Args:
        mechanism: a causal mechanism of the registry (``mechanisms.names(causal=True)``), for every block.
        vocab, dim, n_heads, n_layers, mlp_ratio: V token values (256: bytes), width C, H heads, L blocks, the
            MLP's hidden width ``mlp_ratio * C``.
        device, dtype: of the parameters, as for torch's layers.

    Shape:
        ``forward(tokens, start=0)``: (B, N) integer tokens -> (B, N, V) logits; with ``initial_state`` and
        ``output_final_state=True`` -> (logits, :class:`LMState`); ``step(token, state)``: (B,) -> ((B, V),
        :class:`LMState`).

    Example:
        >>> import torch
        >>> from attnbook.lm import DecoderLM
        >>> model = DecoderLM("linear", dim=32, n_heads=4, n_layers=2).eval()
        >>> tokens = torch.randint(0, 256, (1, 12))
        >>> logits, state = model(tokens[:, :11], output_final_state=True)  # prefill 11 tokens
        >>> next_logits, state = model.step(tokens[:, 11], state)  # then one at a time
        >>> torch.allclose(next_logits, model(tokens)[:, 11], atol=1e-4)
        True
    """

    def __init__(
        self,
        mechanism: str,
        *,
        vocab: int = 256,
        dim: int = 64,
        n_heads: int = 4,
        n_layers: int = 2,
        mlp_ratio: int = 4,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__()
        name = "DecoderLM"
        mechanism = check_choice(mechanism, "mechanism", list(mechanisms.MECHANISMS), name=name)
        self.vocab = check_int(vocab, "vocab", name=name, minimum=2)
        self.dim = check_int(dim, "dim", name=name, minimum=1)
        n_heads = check_int(n_heads, "n_heads", name=name, minimum=1)
        n_layers = check_int(n_layers, "n_layers", name=name, minimum=1)
        mlp_ratio = check_int(mlp_ratio, "mlp_ratio", name=name, minimum=1)
        check_divisible(dim, n_heads, name=name, total_arg="dim", parts_arg="n_heads")
        self.mechanism = mechanism
        self.n_heads, self.n_layers = n_heads, n_layers
        factory: dict[str, Any] = {"device": device, "dtype": dtype}
        self.embed = nn.Embedding(vocab, dim, **factory)
        self.blocks = nn.ModuleList(Block(mechanism, dim, n_heads, mlp_ratio, **factory) for _ in range(n_layers))
        self.norm = nn.LayerNorm(dim, **factory)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Draw every parameter again: GPT-2's initialisation (below), the LayerNorms at one and zero."""
        for module in self.modules():
            if isinstance(module, nn.LayerNorm):
                module.reset_parameters()
        self.apply(self._init)

    @staticmethod
    def _init(module: nn.Module) -> None:
        # GPT-2's initialisation: small normal weights, zero biases; embeddings N(0, 1 / C) so that the
        # scaled embedding sqrt(C) E[x] has unit-size entries, like the positions it is added to.
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=module.embedding_dim**-0.5)

    def extra_repr(self) -> str:
        return f"mechanism={self.mechanism!r}, vocab={self.vocab}, dim={self.dim}, n_layers={self.n_layers}"

    @property
    def recurrent(self) -> bool:
        """True when generation carries a constant-size state (linear, flow), False for a KV cache."""
        return self._blocks()[0].recurrent

    def _blocks(self) -> list[Block]:
        return [cast(Block, block) for block in self.blocks]

    def _check_tokens(self, tokens: Any, arg: str, dims: int) -> torch.Tensor:
        return check_token_ids(
            tokens, arg, name="DecoderLM", vocab=self.vocab, layout="(B, N)" if dims == 2 else "(B,)"
        )

    def _embed(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x: torch.Tensor = self.embed(tokens)  # (B, N, C) or (B, C)
        return x * math.sqrt(self.dim) + sinusoidal_positions(positions, self.dim, x.dtype)

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self.norm(x), self.embed.weight)  # (..., V): the head tied to the embeddings

    def forward(
        self,
        tokens: torch.Tensor,
        start: int | None = None,
        *,
        initial_state: LMState | None = None,
        output_final_state: bool = False,
    ) -> Any:
        """Next-token logits (B, N, V) at every position of tokens (B, N), the first at position ``start`` (default
        0, or ``initial_state.t``); ``initial_state``: the :class:`LMState` of the tokens before these;
        ``output_final_state``: also return the :class:`LMState` after the last token, for :meth:`step`."""
        name = "DecoderLM"
        tokens = self._check_tokens(tokens, "tokens", 2)
        output_final_state = check_bool(output_final_state, "output_final_state", name=name)
        if initial_state is not None:
            self._check_state(initial_state, name=name, arg="initial_state")
            t = initial_state.t
            if start is not None:
                check_same_value(t, start, "initial_state.t", "start", name=name, why=" (positions continue the state)")
            start = t
        start = check_int(0 if start is None else start, "start", name=name, minimum=0, maximum=2**62)  # int64
        positions = torch.arange(start, start + tokens.shape[1], device=tokens.device)  # (N,)
        x = self._embed(tokens, positions)  # (B, N, C)
        if initial_state is None and not output_final_state:
            for block in self._blocks():
                x = block(x)  # (B, N, C)
            return self._logits(x)  # (B, N, V)
        layers = []
        previous = initial_state.layers if initial_state is not None else (None,) * len(self.blocks)
        for block, layer_state in zip(self._blocks(), previous, strict=True):
            x, layer_state = block(x, layer_state, output_final_state=True)  # (B, N, C)
            layers.append(layer_state)
        logits = self._logits(x)  # (B, N, V)
        state = LMState(start + tokens.shape[1], tuple(layers))
        return (logits, state) if output_final_state else logits

    def _check_state(self, state: Any, *, name: str, arg: str) -> None:
        n = len(self.blocks)
        check_instance(state, arg, LMState, name=name, what=f"an LMState with {n} layers or None")
        check_instance(state.layers, f"{arg}.layers", (tuple, list), name=name, what=f"a tuple of {n} layer states")
        check_count(state.layers, f"{arg}.layers", name=name, minimum=n, maximum=n, item="layer")
        if not tracing():  # traced, t is a symbolic int
            check_int(state.t, f"{arg}.t", name=name, minimum=0, maximum=2**62, why=" (the tokens seen)")

    def initial_state(self) -> LMState:
        """The state before the first token (position 0, every layer empty)."""
        return LMState(0, tuple(block.initial_state() for block in self._blocks()))

    def step(self, token: torch.Tensor, state: LMState | None = None) -> tuple[torch.Tensor, LMState]:
        """``(logits (B, V), new state)`` for the token after ``token`` (B,), given the state of the tokens before
        it: the rows of :meth:`forward` over the same tokens."""
        token = self._check_tokens(token, "token", 1)
        if state is None:
            state = self.initial_state()
        else:
            self._check_state(state, name="DecoderLM.step", arg="state")
        x = self._embed(token, torch.tensor([state.t], device=token.device))  # (B, C)
        layers = []
        for block, layer_state in zip(self._blocks(), state.layers, strict=True):
            x, layer_state = block.step(x, layer_state)  # (B, C)
            layers.append(layer_state)
        return self._logits(x), LMState(state.t + 1, tuple(layers))

    @torch.no_grad()
    def generate(
        self,
        prompt: torch.Tensor,
        n_new: int,
        *,
        temperature: float = 1.0,
        top_k: int | None = None,
        seed: int = 0,
        decoder: str = "eager",
    ) -> torch.Tensor:
        """Sample ``n_new`` tokens after ``prompt`` (B, P), one at a time; returns (B, P + n_new).

        The prompt is prefilled in one call, then each new token is drawn from ``softmax(logits / temperature)``
        (over the ``top_k`` likeliest when given; ``temperature=0``: the likeliest) and fed back, in eval mode
        without gradients. ``decoder``: ``"eager"`` steps with :meth:`step`, ``"compiled"`` with that step
        compiled (dynamic shapes); ``"static"`` is deprecated and steps as ``"eager"``.
        """
        name = "DecoderLM.generate"
        prompt = self._check_tokens(prompt, "prompt", 2)
        n_new = check_int(n_new, "n_new", name=name, minimum=0)
        temperature = check_number(temperature, "temperature", name=name, minimum=0.0)
        if top_k is not None:
            top_k = check_int(top_k, "top_k", name=name, minimum=1, maximum=self.vocab)
        generator = torch.Generator(device=prompt.device).manual_seed(
            check_int(seed, "seed", name=name, minimum=-(2**63), maximum=2**64 - 1, why=" (a 64-bit seed)")
        )
        decoder = check_choice(decoder, "decoder", ("eager", "compiled", "static"), name=name)
        if decoder == "static":
            warnings.warn(
                f"{name}: decoder='static' is deprecated since attnbook 0.3.0 (the preallocated decoder is gone); "
                "it steps as decoder='eager' does",
                FutureWarning,
                stacklevel=2,
            )
        was_training = self.training
        self.eval()
        try:
            logits, state = self(prompt, output_final_state=True)  # (B, P, V): the prompt in one pass
            advance = torch.compile(self.step, dynamic=True) if decoder == "compiled" else self.step
            logits = logits[:, -1]  # (B, V)
            out = [prompt]
            for i in range(n_new):
                logits = logits.float()
                if temperature == 0:
                    token = logits.argmax(-1)  # (B,)
                else:
                    # less the largest first: the largest is then 0 at any temperature, never inf / inf
                    logits = (logits - logits.amax(-1, keepdim=True)) / temperature
                    if top_k is not None:
                        kth = logits.topk(top_k, dim=-1).values[:, -1:]  # (B, 1)
                        logits = logits.masked_fill(logits < kth, float("-inf"))
                    token = torch.multinomial(logits.softmax(-1), 1, generator=generator)[:, 0]  # (B,)
                out.append(token.unsqueeze(1))
                if i + 1 < n_new:  # the last token needs no logits after it
                    logits, state = advance(token, state)
            return torch.cat(out, dim=1)  # (B, P + n_new)
        finally:
            self.train(was_training)
