"""Generation at the hardware's pace: a decoder whose state is allocated once and updated in place (chapter 7).

:meth:`attnbook.lm.DecoderLM.step` is the teaching path: every call validates its inputs, goes through each
layer's :meth:`~attnbook.ProjectedAttention.step`, and returns a new state. At the sizes of chapter 7 one
token costs a few tens of microseconds of arithmetic, and that path spends most of its time elsewhere: in
checks, in Python, in the dispatch of about a hundred small operations, in new tensors for every state.

:class:`StaticDecoder` does the same arithmetic with as few operations as it can:

* the state is made once, for a given batch and capacity, and every step writes into it: a recurrent state
  (linear attention's [S | z], Flow-Attention's prefix sums, kept in pairs so that one operation updates the
  queries' and the keys' sums) is updated in place, a KV cache is a preallocated (B, H, capacity, D) buffer
  whose row t is written and whose first t + 1 rows are read as a view (no copy, no growth): by SDPA, but on
  the CPU beyond 2048 keys by two batched products, where SDPA's fused kernel read the cache at two thirds of
  their speed for one query;
* each layer's query, key and value projections are one matrix product, the positions a precomputed table, the
  query and key features one call, the linear attention's numerator and normaliser one product with [S | z];
* the attention's outputs are written into a buffer whose last column is 1, so that the out projection, its
  bias and the residual connection are one call (``torch.addmm(x, o1, [Wo; bo])``);
* no checks inside a step (the decoder checks once, when it is made and when a prompt is prefilled).

That still leaves about fifty torch operations a token, each a few microseconds of dispatch, several times the
arithmetic at chapter 7's width. So on the CPU, in float32, the step is by default *native*: ``_step.c`` does
the whole token (embedding, every block's norms, projections, attention and MLP, the head) in one C call on the
decoder's own buffers (compiled on first use with the host's C compiler, loaded by :mod:`ctypes`; see
:mod:`attnbook._native`). It runs blocks of softmax attention, of linear attention with elu + 1 or relu
features, of Flow-Attention (either ablation) and of mixture-of-head attention without q, k or head norms; a
model with any other block (another feature map, a MoH layer with those norms), on another device or in
another dtype, or a machine without a C compiler, keeps torch's operations (``native=False`` asks for those;
``native=True`` says why it cannot).

A prompt is prefilled in one parallel call (``model(prompt, output_final_state=True)``, the library's chunked
forward) and its state copied into the buffers. Optionally the step is compiled (``compile=True``:
``torch.compile``; on CUDA ``mode="reduce-overhead"`` records it as a CUDA graph, which needs every shape
fixed: the KV cache is then read whole, with the rows after t masked; on the CPU inductor's C++ wrapper).

Every step's logits equal :meth:`~attnbook.lm.DecoderLM.step`'s to rounding (``tests/test_decoding.py``).
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Callable
from typing import Any, NamedTuple, cast

import torch
import torch.nn.functional as F
from torch import nn

from . import _native
from ._checks import (
    check_bool,
    check_choice,
    check_exclusive,
    check_instance,
    check_int,
    check_supported,
    check_token_ids,
)
from ._runtime import accumulation_dtype
from .feature_maps import FEATURE_MAPS
from .flow import FlowAttention, FlowState
from .linear import LinearAttention, LinearState
from .lm import Block, DecoderLM, LMState, sinusoidal_positions
from .moh import MoHAttention
from .softmax import KVCache

__all__ = ["StaticDecoder"]


class _Layer:
    """One block's weights, gathered for the step (made once, by :class:`StaticDecoder`).

    ``wqkv`` (C, 3 H D) and ``bqkv``: the query, key and value projections as one product. ``wo1`` (H Dv + 1, C):
    the out projection with its bias as a last row, so that with the attention's outputs written into a buffer
    whose last column is 1 the projection and its bias are one product, added to the residual stream by the
    same call (``torch.addmm(x, o1, wo1)``). ``w1``, ``b1``, ``w2``, ``b2``: the MLP.
    """

    def __init__(self, block: Block):
        attn = block.attn
        self.norm1 = (block.norm1.weight, block.norm1.bias, block.norm1.eps)
        self.norm2 = (block.norm2.weight, block.norm2.bias, block.norm2.eps)
        first, second = cast(nn.Linear, block.mlp[0]), cast(nn.Linear, block.mlp[2])
        self.w1, self.b1, self.w2, self.b2 = first.weight.t(), first.bias, second.weight.t(), second.bias
        self.eps = 0.0
        self.bqkv: torch.Tensor | None
        self.phi: Callable[[torch.Tensor], torch.Tensor] | None = None  # None: elu + 1, on q and k at once
        self.elementwise = True  # phi maps each number on its own (q's and k's features in one call)
        self.competition = self.allocation = True
        if isinstance(attn, MoHAttention):
            self.kind = "moh"
            self.H, self.D = attn.num_heads, attn.head_dim
            self.wqkv, self.bqkv = attn.qkv.weight.t(), attn.qkv.bias
            out_weight, out_bias = attn.proj.weight, attn.proj.bias
            self.moh = attn
        else:
            self.H = attn.n_heads
            self.D = attn.d_model // attn.n_heads
            projections = (attn.query_projection, attn.key_projection, attn.value_projection)
            self.wqkv = torch.cat([p.weight for p in projections]).t()  # (C, 3 H D): one product for q, k and v
            self.bqkv = torch.cat([p.bias for p in projections])
            out_weight, out_bias = attn.out_projection.weight, attn.out_projection.bias
            if isinstance(attn, LinearAttention):
                self.kind = "linear"
                self.eps = attn.eps
                built_in = _BUILT_IN.get(attn.feature_map)
                # the built-in maps as one operation each on q and k together (the layer's own map checks its
                # input first); elu + 1 as F.elu(x) + 1, which differs from the layer's form by rounding only
                if built_in == "relu":
                    self.phi = F.relu
                elif built_in != "elu":
                    self.phi, self.elementwise = attn.feature_map, False
            elif isinstance(attn, FlowAttention):
                self.kind = "flow"
                self.eps = attn.eps
                self.competition, self.allocation = attn.competition, attn.allocation
            else:
                self.kind = "softmax"
        bias = out_bias if out_bias is not None else out_weight.new_zeros(out_weight.shape[0])
        self.wo1 = torch.cat([out_weight.t(), bias.unsqueeze(0)])  # (H Dv + 1, C)

    def features(self, qk: torch.Tensor) -> torch.Tensor:
        """phi of the queries and keys of one token, (B, 2, H, D) -> (B, 2, H, R), for an elementwise map."""
        return F.elu(qk).add_(1.0) if self.phi is None else self.phi(qk)


_BUILT_IN = {phi: name for name, phi in FEATURE_MAPS.items()}


def _heads(out: torch.Tensor, H: int) -> torch.Tensor:
    """A layer's output buffer (B, H Dv + 1) without its column of ones, as (B, H, 1, Dv): what ``out=`` writes."""
    return out[:, :-1].view(out.shape[0], H, 1, -1)


def _held_tensors(held: Any) -> list[torch.Tensor]:
    """One layer's held state as its tensors, in the order _step.c's s0 .. s3 take them: [S | z]; Flow's sums,
    ratios, exp_mean and kv; a KV cache's keys and values."""
    return list(held.values()) if isinstance(held, dict) else list(held) if isinstance(held, tuple) else [held]


class _NativeStep(NamedTuple):
    """The compiled step function, the ctypes model that points it at the decoder's buffers, and what must stay
    alive behind those pointers (the layers' structures, the weights copied for it, its scratch)."""

    step: Any
    model: Any
    alive: tuple[Any, ...]


# the cached keys up to which the CPU step reads a KV cache with SDPA (_cached; measured, one thread)
_SDPA_UP_TO = 2048


class StaticDecoder:
    """A :class:`~attnbook.lm.DecoderLM` generating token by token from state allocated once (module docstring).

    Args:
        model: the model; read, not copied (later changes to its weights are not seen: make a new decoder).
        batch: the batch size B of every prompt and step.
        capacity: the most tokens (prompt and generated) a KV cache holds; recurrent states need none, but the
            position table has this many rows too.
        compile: compile the step with ``torch.compile`` (on CUDA as a CUDA graph, ``mode="reduce-overhead"``;
            on the CPU with inductor's C++ wrapper, which calls the compiled kernels without Python in between).
        native: the native step (module docstring): None (default) where it can run and ``compile`` is False,
            True to insist (a ValueError says why it cannot), False for torch's operations. :attr:`native`
            says which runs.

    Example:
        >>> import torch
        >>> from attnbook.lm import DecoderLM
        >>> from attnbook.decoding import StaticDecoder
        >>> model = DecoderLM("linear", dim=32, n_heads=4).eval()
        >>> tokens = torch.randint(0, 256, (1, 10))
        >>> decoder = StaticDecoder(model, batch=1, capacity=64)
        >>> _ = decoder.prefill(tokens[:, :9])
        >>> torch.allclose(decoder.step(tokens[:, 9]), model(tokens)[:, 9], atol=1e-4)
        True
    """

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
        self.model = check_instance(model, "model", DecoderLM, name=name, what="a DecoderLM")
        self.batch = check_int(batch, "batch", name=name, minimum=1)
        self.capacity = check_int(capacity, "capacity", name=name, minimum=1)
        compile = check_bool(compile, "compile", name=name)
        if native is not None:
            native = check_bool(native, "native", name=name)
            why = " (a compiled step is torch's; the native one is already one call)"
            check_exclusive(compile, native, "compile", "native", name=name, why=why)
        weight = model.embed.weight
        self.device, self.dtype = weight.device, weight.dtype
        self.acc = accumulation_dtype(self.dtype)
        self.cast = self.acc != self.dtype  # the state is kept in a wider dtype than the model's
        with torch.no_grad():
            self.embed = (weight * math.sqrt(model.dim)).detach()  # (V, C): sqrt(C) E, scaled once
            positions = torch.arange(self.capacity, device=self.device)
            self.positions = sinusoidal_positions(positions, model.dim, self.dtype)  # (capacity, C)
            self.layers = [_Layer(cast(Block, block)) for block in model.blocks]
            self.head = weight.detach().t()  # (C, V): the head tied to the embeddings
            norm = model.norm
            self.norm = (norm.weight, norm.bias, norm.eps)
        self.t = 0
        self._allocate()
        self._step = self._step_eager
        # The native step (_step.c, one C call a token): by default wherever it can run, unless compiled
        self._native: _NativeStep | None = None
        if native or (native is None and not compile):
            why = self._native_unsupported()
            if not why:
                built = _native.library()
                why = "" if built is not None else _native.unavailable()
                if built is not None:
                    self._native = self._native_context(built)
            if native:
                check_supported(not why, "the native step", name=name, expected="be available for native=True", got=why)
        # Compiled, the step has fixed shapes (the position a tensor, the KV cache read whole with the rows after
        # t masked): one graph for every t, which a CUDA graph can replay. (With dynamic shapes instead, torch
        # 2.13's CPU code generation gave linear attention wrong logits: tests/test_decoding.py.)
        self.graph = compile
        if compile:
            if self.device.type == "cuda":
                # A CUDA graph copies every input that torch does not know to be static into its own buffer at
                # each replay, and is not recorded at all when such an input is written in place: on an H200
                # (torch 2.11) inductor skipped the graph ("mutated inputs") and the compiled step ran no faster
                # than the eager one. Every tensor the step reads or writes keeps its address; torch is told so.
                for tensor in self._tensors():
                    torch._dynamo.mark_static_address(tensor)
                self._step = torch.compile(self._step_eager, mode="reduce-overhead", dynamic=False, fullgraph=True)
            else:  # inductor's C++ wrapper calls the kernels without Python between them (113 against 139 us a
                # step of chapter 7's 128-wide model with the Python wrapper, alternating, one thread)
                options: dict[str, str | int | bool | Callable[..., Any]] = {"cpp_wrapper": True}
                self._step = torch.compile(self._step_eager, dynamic=False, fullgraph=True, options=options)

    # -- the native step ----------------------------------------------------------------------------------------

    def _native_unsupported(self) -> str:
        """Why the native step cannot run this decoder ('' when it can): it does float32 on the CPU, and the
        blocks of softmax attention, linear attention with elu + 1 or relu features, Flow-Attention, and MoH without
        norms on q, k or the heads."""
        if self.device.type != "cpu":
            return f"the model is on {self.device} (the native step runs on the CPU)"
        if self.dtype != torch.float32:
            return f"the model is {str(self.dtype).removeprefix('torch.')} (the native step runs float32)"
        for i, layer in enumerate(self.layers):
            if layer.kind == "moh":
                attn = layer.moh
                if not all(isinstance(m, nn.Identity) for m in (attn.q_norm, attn.k_norm, attn.norm)):
                    return f"block {i}'s MoH layer normalises q, k or its heads (torch's operations run it)"
            if layer.kind == "linear" and layer.phi not in (None, F.relu):
                return f"block {i}'s feature map is not elu + 1 or relu (torch's operations run it)"
            if layer.norm1[0] is None or layer.norm2[0] is None:
                return f"block {i}'s layer norms have no weights"
        if self.norm[0] is None:
            return "the final layer norm has no weights"
        return ""

    @property
    def native(self) -> bool:
        """Whether :meth:`step` runs the native step (one C call a token) rather than torch's operations."""
        return self._native is not None

    def _native_context(self, lib: Any) -> _NativeStep:
        """The ctypes structures that point _step.c at the decoder's buffers, and every tensor behind them.

        Weights are copied once into the (in, out) layout the C loops read; states and caches are the decoder's
        own tensors (so :meth:`prefill`, :meth:`reset` and :meth:`state` see what the steps write)."""
        keep: list[torch.Tensor] = []

        def ptr(x: torch.Tensor | None) -> int | None:
            if x is None:
                return None
            x = x.detach().contiguous()
            keep.append(x)
            return x.data_ptr()

        kinds = {"softmax": 0, "linear": 1, "flow": 2, "moh": 3}
        layers = (_native.Layer * len(self.layers))()
        for native, layer, held in zip(layers, self.layers, self.states, strict=True):
            native.kind, native.H, native.D = kinds[layer.kind], layer.H, layer.D
            native.hidden, native.phi = layer.w1.shape[1], int(layer.phi is F.relu)
            native.competition, native.allocation = int(layer.competition), int(layer.allocation)
            native.eps, native.ln1_eps, native.ln2_eps = layer.eps, layer.norm1[2], layer.norm2[2]
            native.scale = layer.D**-0.5
            if layer.kind == "moh":
                attn = layer.moh
                native.scale = attn.scale
                native.shared, native.picked, native.experts = attn.shared_head, attn.routed_head, attn.num_routed
                for slot, name in (("wg", "wg"), ("wg0", "wg_0"), ("wg1", "wg_1")):
                    router = getattr(attn, name, None)
                    setattr(native, slot, ptr(router.weight.t()) if router is not None else None)
            native.ln1_w, native.ln1_b = ptr(layer.norm1[0]), ptr(layer.norm1[1])
            native.ln2_w, native.ln2_b = ptr(layer.norm2[0]), ptr(layer.norm2[1])
            native.wqkv, native.bqkv = ptr(layer.wqkv), ptr(layer.bqkv)
            native.wo, native.bo = ptr(layer.wo1[:-1]), ptr(layer.wo1[-1])
            native.w1, native.b1, native.w2, native.b2 = ptr(layer.w1), ptr(layer.b1), ptr(layer.w2), ptr(layer.b2)
            for slot, x in zip(("s0", "s1", "s2", "s3"), _held_tensors(held), strict=False):
                assert x.is_contiguous()
                setattr(native, slot, x.data_ptr())
        model = _native.Model()
        model.B, model.C, model.V, model.L = self.batch, self.embed.shape[1], self.embed.shape[0], len(self.layers)
        model.capacity, model.lnf_eps = self.capacity, self.norm[2]
        model.embed, model.positions, model.head = ptr(self.embed), ptr(self.positions), ptr(self.head)
        model.lnf_w, model.lnf_b = ptr(self.norm[0]), ptr(self.norm[1])
        model.layers = layers
        work = torch.empty(int(lib.attnbook_work_size(ctypes.byref(model))), dtype=torch.float32)
        model.work = ptr(work)
        return _NativeStep(lib.attnbook_step, ctypes.pointer(model), (layers, keep))

    # -- state ---------------------------------------------------------------------------------------------

    def _tensors(self) -> list[torch.Tensor]:
        """Every tensor the step reads or writes: weights, positions, states, caches and output buffers."""
        found: list[torch.Tensor] = []

        def add(x: Any) -> None:
            if isinstance(x, torch.Tensor):
                found.append(x)
            elif isinstance(x, (list, tuple)):
                for y in x:
                    add(y)
            elif isinstance(x, dict):
                for y in x.values():
                    add(y)

        add([self.embed, self.positions, self.head, self.norm, self.tensors(), self.outputs, self.values1])
        for layer in self.layers:
            add([v for v in vars(layer).values() if not isinstance(v, torch.nn.Module)])
        return found

    def _allocate(self) -> None:
        B, cap, acc = self.batch, self.capacity, self.acc
        self.states: list[Any] = []
        self.outputs: list[torch.Tensor] = []  # per layer (B, H Dv + 1): the attention's outputs, then a 1
        self.values1: list[torch.Tensor | None] = []  # linear attention: (B, H, 1, Dv + 1), [v | 1]
        for layer in self.layers:
            H, D = layer.H, layer.D
            like = layer.wqkv
            out = like.new_ones(B, layer.wo1.shape[0])
            self.outputs.append(out)
            values1 = None
            if layer.kind == "linear":
                R = D if layer.elementwise else layer.phi(like.new_zeros(1, D, dtype=acc)).shape[-1]  # type: ignore[misc]
                self.states.append(like.new_zeros(B, H, R, D + 1, dtype=acc))  # [S | z] of every (b, h)
                values1 = like.new_ones(B, H, 1, D + 1, dtype=acc)
            elif layer.kind == "flow":
                self.states.append(
                    {
                        # the running sums in pairs, so that one operation updates both: [query_sum, key_sum]
                        # and [query_over_incoming, key_over_outgoing], each (B, 2, H, D); the keys' order is the order
                        # _step.c takes them in (s0 .. s3, by _held_tensors)
                        "sums": like.new_zeros(B, 2, H, D, dtype=acc),
                        "ratios": like.new_zeros(B, 2, H, D, dtype=acc),
                        "exp_mean": like.new_zeros(B, H, dtype=acc),
                        "kv": like.new_zeros(B, H, D, D, dtype=acc),
                    }
                )
            else:
                self.states.append((like.new_zeros(B, H, cap, D), like.new_zeros(B, H, cap, D)))
            self.values1.append(values1)

    def reset(self) -> None:
        """Forget every token: position 0, empty states."""
        self.t = 0
        for state in self.states:
            if isinstance(state, dict):
                for x in state.values():
                    x.zero_()
            elif isinstance(state, tuple):
                pass  # a KV cache's rows after t are never read
            else:
                state.zero_()

    @torch.no_grad()
    def prefill(self, tokens: torch.Tensor) -> torch.Tensor:
        """Run a prompt (B, P) in one parallel call and hold its state; returns its logits (B, P, V).

        The decoder starts afresh (:meth:`reset`); the positions of the prompt are 0 .. P - 1.
        """
        name = "StaticDecoder.prefill"
        tokens = check_token_ids(tokens, "tokens", name=name, vocab=self.model.vocab, layout="(B, N)")
        check_choice(tokens.shape[0], "the prompt's batch size", (self.batch,), name=name, why=" (the decoder's)")
        check_int(tokens.shape[1], "the prompt's length", name=name, maximum=self.capacity, why=" (the capacity)")
        self.reset()
        logits, state = self.model(tokens, output_final_state=True)  # (B, P, V)
        for held, layer_state in zip(self.states, state.layers, strict=True):
            self._load(held, layer_state)
        self.t = tokens.shape[1]
        return cast(torch.Tensor, logits)

    def _load(self, held: Any, state: Any) -> None:
        if isinstance(state, LinearState):
            held.copy_(torch.cat([state.S, state.z.unsqueeze(-1)], dim=-1))
        elif isinstance(state, FlowState):
            held["sums"].copy_(torch.stack([state.query_sum, state.key_sum], 1))
            held["ratios"].copy_(torch.stack([state.query_over_incoming, state.key_over_outgoing], 1))
            held["exp_mean"].copy_(state.exp_mean)
            held["kv"].copy_(state.kv)
        elif isinstance(state, KVCache):
            keys, values = held
            keys[:, :, : state.t].copy_(state.keys)
            values[:, :, : state.t].copy_(state.values)

    # -- one token -------------------------------------------------------------------------------------------

    @torch.no_grad()
    def step(self, token: torch.Tensor) -> torch.Tensor:
        """Logits (B, V) for the token after ``token`` (B,), which takes position ``t``; then ``t += 1``."""
        t = self.t
        if t >= self.capacity:
            why = " (the decoder's capacity: make one with a larger capacity)"
            check_int(t + 1, "the number of tokens", name="StaticDecoder.step", maximum=self.capacity, why=why)
        if self._native is not None:
            return self._native_step(token, t)
        if self.graph:  # fixed shapes: the position is a tensor
            logits = self._step(token, torch.full((), t, device=self.device, dtype=torch.long))
            if self.device.type == "cuda":  # the next replay of the CUDA graph writes over its output
                logits = logits.clone()
        else:
            logits = self._step(token, t)
        self.t = t + 1
        return logits

    def _native_step(self, token: torch.Tensor, t: int) -> torch.Tensor:
        """One C call: _step.c reads the token ids (checking their range), updates the state, writes the logits."""
        native = cast(_NativeStep, self._native)
        if token.dtype != torch.long or token.shape != (self.batch,) or token.device.type != "cpu":
            token = check_token_ids(token, "token", name="StaticDecoder.step", vocab=self.model.vocab, layout="(B,)")
            check_choice(token.shape[0], "the token's batch size", (self.batch,), name="StaticDecoder.step")
            token = token.to("cpu", torch.long)
        token = token.contiguous()
        logits = torch.empty(self.batch, self.model.vocab)
        bad = native.step(native.model, token.data_ptr(), t, logits.data_ptr())
        if bad:  # a token id out of range: nothing was read or written
            check_token_ids(token, "token", name="StaticDecoder.step", vocab=self.model.vocab, layout="(B,)")
        self.t = t + 1
        return logits

    def _step_eager(self, token: torch.Tensor, t: Any) -> torch.Tensor:
        position = self.positions.index_select(0, t.view(1)) if self.graph else self.positions[t]  # (1, C) or (C,)
        x = torch.add(self.embed.index_select(0, token), position)  # (B, C)
        C = x.shape[-1]
        for layer, state, out, values1 in zip(self.layers, self.states, self.outputs, self.values1, strict=True):
            h = F.layer_norm(x, (C,), *layer.norm1[:2], layer.norm1[2])
            if layer.kind == "moh":
                self._moh(layer, state, h, t, out)
            else:
                qkv = torch.addmm(layer.bqkv, h, layer.wqkv) if layer.bqkv is not None else h @ layer.wqkv
                if layer.kind == "linear":
                    self._linear_step(layer, state, values1, qkv, out)
                elif layer.kind == "flow":
                    self._flow_step(layer, state, qkv, t, out)
                else:
                    B, H, D = x.shape[0], layer.H, layer.D
                    q, k, v = qkv.view(B, 3, H, D).unbind(1)  # (B, H, D) each
                    self._cached(state, q, k, v, t, None, out)
            x = torch.addmm(x, out, layer.wo1)  # x + o Wo + bo: the out projection and the residual in one call
            h = F.layer_norm(x, (C,), *layer.norm2[:2], layer.norm2[2])
            x = torch.addmm(x, F.gelu(torch.addmm(layer.b1, h, layer.w1)), layer.w2).add_(layer.b2)  # (B, C)
        return F.layer_norm(x, (C,), *self.norm[:2], self.norm[2]) @ self.head  # (B, V)

    def _linear_step(self, layer: _Layer, Sz: torch.Tensor, values1: Any, qkv: torch.Tensor, out: torch.Tensor) -> None:
        """S += phi(k) v^T, z += phi(k) as one rank-one update of [S | z]; out = phi(q)^T S / (phi(q)^T z + eps)."""
        B, H, D = Sz.shape[0], layer.H, layer.D
        acc = Sz.dtype
        qkv = qkv.view(B, 3, H, D)
        if layer.elementwise:
            qk = qkv[:, :2].to(acc) if self.cast else qkv[:, :2]
            f = layer.features(qk)  # (B, 2, H, R): phi(q) and phi(k) in one call
            fq, fk = f[:, 0].unsqueeze(-2), f[:, 1].unsqueeze(-1)  # (B, H, 1, R), (B, H, R, 1)
        else:
            phi = cast(Callable[[torch.Tensor], torch.Tensor], layer.phi)
            fq, fk = phi(qkv[:, 0].to(acc)).unsqueeze(-2), phi(qkv[:, 1].to(acc)).unsqueeze(-1)
        values1[..., :D].copy_(qkv[:, 2].unsqueeze(-2))  # [v | 1], (B, H, 1, D + 1)
        Sz.addcmul_(fk, values1)  # (B, H, R, D + 1): S += phi(k) v^T and z += phi(k), in place
        r = torch.matmul(fq, Sz)  # (B, H, 1, D + 1): numerator and normaliser in one product
        torch.div(r[..., :D], r[..., D:].add_(layer.eps), out=_heads(out, H))

    def _flow_step(
        self, layer: _Layer, s: dict[str, torch.Tensor], qkv: torch.Tensor, t: Any, out: torch.Tensor
    ) -> None:
        """One token of causal Flow-Attention on the prefix sums held in place (as
        :func:`attnbook.flow_attention_step`): the queries' and keys' quantities side by side, (B, 2, H, ...), so
        that each running sum of the pair is updated by one operation."""
        acc, eps = s["kv"].dtype, layer.eps
        B, H, D = qkv.shape[0], layer.H, layer.D
        n = t + 1  # the tokens seen, this one included
        qkv = qkv.view(B, 3, H, D)
        qk = torch.sigmoid(qkv[:, :2].to(acc) if self.cast else qkv[:, :2])  # (B, 2, H, D): [q~, k~]
        sums, ratios = s["sums"], s["ratios"]
        sums.add_(qk)  # [sum q~, sum k~]
        shifted = qk + eps
        # [I n, O n]: (q~ + eps) . (sum k~ + eps) and (k~ + eps) . (sum q~ + eps), (B, 2, H)
        flows = (shifted * (sums + eps).flip(1)).sum(-1)
        # [sum q~ / I, sum k~ / O] += [q~ / I, k~ / O]
        if isinstance(n, int):
            ratios.addcdiv_(qk, flows.unsqueeze(-1), value=n)
        else:
            ratios.add_(qk * n / flows.unsqueeze(-1))
        conserved = (shifted * (ratios + eps).flip(1)).sum(-1) / n  # (B, 2, H): [I^, O^]
        v = qkv[:, 2].to(acc) if self.cast else qkv[:, 2]  # (B, H, Dv)
        if layer.competition:
            expo = conserved[:, 1].clamp(-1.0, 1.0).exp()  # (B, H)
            mean = s["exp_mean"].lerp_(expo, 1.0 / n)  # the running mean of exp(O^), this token's included
            v = v * (expo / mean).unsqueeze(-1)
        s["kv"].addcmul_(qk[:, 1].unsqueeze(-1), v.unsqueeze(-2))  # (B, H, D, Dv) += k~ (c v)^T
        scale = torch.sigmoid(conserved[:, 0]) / flows[:, 0] if layer.allocation else flows[:, 0].reciprocal()
        torch.mul(torch.matmul(qk[:, 0].unsqueeze(-2), s["kv"]), scale[..., None, None], out=_heads(out, H))

    def _cached(
        self,
        cache: tuple[torch.Tensor, torch.Tensor],
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        t: Any,
        scale: float | None,
        out: torch.Tensor,
    ) -> None:
        """The new query over the cached keys 0 .. t: row t written in place, then read as a view of the cache."""
        keys, values = cache
        target = _heads(out, q.shape[1])
        if self.graph:  # fixed shapes: write by index, read every row, mask those after t (O(capacity) a step)
            index = t.view(1)
            keys.index_copy_(2, index, k.unsqueeze(2))
            values.index_copy_(2, index, v.unsqueeze(2))
            allowed = (torch.arange(keys.shape[2], device=keys.device) <= t).view(1, 1, 1, -1)  # (1, 1, 1, capacity)
            target.copy_(F.scaled_dot_product_attention(q.unsqueeze(2), keys, values, attn_mask=allowed, scale=scale))
            return
        keys[:, :, t] = k
        values[:, :, t] = v
        n = t + 1
        if keys.device.type == "cpu" and n > _SDPA_UP_TO:
            # On the CPU, one query over a long cache: scores, softmax and sum as two batched products. SDPA's
            # fused kernel read two layers' caches at two thirds of their speed at t = 8192 (451 against 662 us);
            # up to about 2048 keys its single call is the quicker (9 against 14 us a layer at t = 16)
            scores = torch.matmul(q.unsqueeze(2), keys[:, :, :n].transpose(-1, -2))  # (B, H, 1, n)
            weights = torch.softmax(scores.mul_(scale if scale is not None else q.shape[-1] ** -0.5), dim=-1)
            torch.matmul(weights, values[:, :, :n], out=target)
        else:
            target.copy_(F.scaled_dot_product_attention(q.unsqueeze(2), keys[:, :, :n], values[:, :, :n], scale=scale))

    def _moh(
        self, layer: _Layer, cache: tuple[torch.Tensor, torch.Tensor], h: torch.Tensor, t: Any, out: torch.Tensor
    ) -> None:
        """One token of MoH: the router's gates (the layer's own :meth:`~attnbook.MoHAttention.route`), the heads
        over the cache, the gated heads normalised (the layer's ``norm``) into the output buffer."""
        attn = layer.moh
        B, H, D = h.shape[0], layer.H, layer.D
        gates = attn.route(h.unsqueeze(1)).gates[:, 0]  # (B, H), in at least float32
        qkv = (torch.addmm(layer.bqkv, h, layer.wqkv) if layer.bqkv is not None else h @ layer.wqkv).view(B, 3, H, D)
        q, k = attn.q_norm(qkv[:, 0]), attn.k_norm(qkv[:, 1])
        self._cached(cache, q, k, qkv[:, 2], t, attn.scale, out)
        gated = (_heads(out, H).to(gates.dtype) * gates[..., None, None]).reshape(B, H * D)
        out[:, :-1].copy_(attn.norm(gated))

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor of the held state (for counting the memory allocated behind it)."""
        return [x for held in self.states for x in _held_tensors(held)]

    def state(self) -> LMState:
        """The state held, as the :class:`~attnbook.lm.LMState` that :meth:`attnbook.lm.DecoderLM.step` takes."""
        layers: list[Any] = []
        B, t = self.batch, self.t
        for layer, held in zip(self.layers, self.states, strict=True):
            if layer.kind == "linear":
                Sz = held.clone()  # (B, H, R, Dv + 1)
                layers.append(LinearState(Sz[..., :-1], Sz[..., -1]))
            elif layer.kind == "flow":
                count = torch.full((B,), t, device=self.device, dtype=torch.int64)
                sums, ratios = held["sums"].clone(), held["ratios"].clone()
                # FlowState's order: key_sum, query_sum, key_over_outgoing, query_over_incoming, exp_mean, kv
                pairs = (sums[:, 1], sums[:, 0], ratios[:, 1], ratios[:, 0])
                layers.append(FlowState(count, *pairs, held["exp_mean"].clone(), held["kv"].clone()))
            else:
                keys, values = held
                layers.append(KVCache.empty().extend(keys[:, :, :t], values[:, :, :t]) if t else KVCache.empty())
        return LMState(t, tuple(layers))
