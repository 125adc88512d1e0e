"""Generation at the hardware's pace: a decoder whose state is allocated once and updated in place (chapter 7).

:meth:`attnbook.lm.DecoderLM.step` is the teaching path: every call validates its inputs, goes through each
layer's :meth:`~attnbook.ProjectedAttention.step`, and returns a new state. At the sizes of chapter 7 one
token costs a few tens of microseconds of arithmetic, and that path spends most of its time elsewhere: in
checks, in Python, in the dispatch of about a hundred small operations, in new tensors for every state.

:class:`StaticDecoder` does the same arithmetic with as few operations as it can:

* the state is made once, for a given batch and capacity, and every step writes into it: a recurrent state
  (linear attention's [S | z], Flow-Attention's prefix sums) is updated in place, a KV cache is a preallocated
  (B, H, capacity, D) buffer whose row t is written and whose first t + 1 rows are read by SDPA as a view
  (no copy, no growth);
* each layer's query, key and value projections are one matrix product, the positions a precomputed table,
  the linear attention's numerator and normaliser one product with [S | z];
* no checks inside a step (the decoder checks once, when it is made and when a prompt is prefilled).

A prompt is prefilled in one parallel call (``model(prompt, output_final_state=True)``, the library's chunked
forward) and its state copied into the buffers. Optionally the step is compiled (``compile=True``:
``torch.compile``; on CUDA ``mode="reduce-overhead"`` records it as a CUDA graph, which needs every shape
fixed: the KV cache is then read whole, with the rows after t masked).

Every step's logits equal :meth:`~attnbook.lm.DecoderLM.step`'s to rounding (``tests/test_decoding.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from ._checks import check_bool, check_choice, check_instance, check_int, check_token_ids
from ._runtime import accumulation_dtype
from .feature_maps import FEATURE_MAPS
from .flow import FlowAttention, FlowState
from .linear import LinearAttention, LinearState
from .lm import Block, DecoderLM, LMState, sinusoidal_positions
from .moh import MoHAttention
from .softmax import KVCache

__all__ = ["StaticDecoder"]


class _Layer:
    """One block's weights, gathered for the step: norms, the fused q/k/v projection, out projection, MLP."""

    def __init__(self, block: Block):
        attn = block.attn
        self.norm1, self.norm2 = block.norm1, block.norm2
        first, second = cast(nn.Linear, block.mlp[0]), cast(nn.Linear, block.mlp[2])
        self.w1, self.b1, self.w2, self.b2 = first.weight.t(), first.bias, second.weight.t(), second.bias
        self.attn = attn
        self.eps = 0.0
        self.bqkv: torch.Tensor | None
        self.phi: Callable[[torch.Tensor], torch.Tensor] = _elu_plus_one
        if isinstance(attn, MoHAttention):
            self.kind = "moh"
            self.H, self.D = attn.num_heads, attn.head_dim
            self.wqkv, self.bqkv = attn.qkv.weight.t(), attn.qkv.bias
            self.wo, self.bo = attn.proj.weight.t(), attn.proj.bias
            self.moh = attn
            return
        family = attn
        self.H = family.n_heads
        self.D = family.d_model // family.n_heads
        projections = (family.query_projection, family.key_projection, family.value_projection)
        self.wqkv = torch.cat([p.weight for p in projections]).t()  # (C, 3 H D): one product for q, k and v
        self.bqkv = torch.cat([p.bias for p in projections])
        self.wo, self.bo = family.out_projection.weight.t(), family.out_projection.bias
        if isinstance(attn, LinearAttention):
            self.kind = "linear"
            self.eps = attn.eps
            # the built-in maps as one operation each (the layer's own feature map checks its input first);
            # elu + 1 as F.elu(x) + 1, which differs from the layer's form by rounding only
            built_in: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"elu": _elu_plus_one, "relu": F.relu}
            self.phi = built_in.get(_BUILT_IN.get(attn.feature_map, ""), attn.feature_map)
        elif isinstance(attn, FlowAttention):
            self.kind = "flow"
            self.eps = attn.eps
        else:
            self.kind = "softmax"


_BUILT_IN = {phi: name for name, phi in FEATURE_MAPS.items()}


def _elu_plus_one(x: torch.Tensor) -> torch.Tensor:
    return F.elu(x).add_(1.0)


def _linear(x: torch.Tensor, weight_t: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.addmm(bias, x, weight_t) if bias is not None else x @ weight_t


class StaticDecoder:
    """A :class:`~attnbook.lm.DecoderLM` generating token by token from state allocated once (module docstring).

    Args:
        model: the model; read, not copied (later changes to its weights are not seen: make a new decoder).
        batch: the batch size B of every prompt and step.
        capacity: the most tokens (prompt and generated) a KV cache holds; recurrent states need none, but the
            position table has this many rows too.
        compile: compile the step with ``torch.compile`` (on CUDA as a CUDA graph, ``mode="reduce-overhead"``).

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

    def __init__(self, model: DecoderLM, *, batch: int = 1, capacity: int = 4096, compile: bool = False):
        name = "StaticDecoder"
        self.model = check_instance(model, "model", DecoderLM, name=name, what="a DecoderLM")
        self.batch = check_int(batch, "batch", name=name, minimum=1)
        self.capacity = check_int(capacity, "capacity", name=name, minimum=1)
        compile = check_bool(compile, "compile", name=name)
        weight = model.embed.weight
        self.device, self.dtype = weight.device, weight.dtype
        self.acc = accumulation_dtype(self.dtype)
        with torch.no_grad():
            self.embed = (weight * math.sqrt(model.dim)).detach()  # (V, C): sqrt(C) E, scaled once
            positions = torch.arange(self.capacity, device=self.device)
            self.positions = sinusoidal_positions(positions, model.dim, self.dtype)  # (capacity, C)
            self.layers = [_Layer(cast(Block, block)) for block in model.blocks]
            self.head = weight.detach().t()  # (C, V): the head tied to the embeddings
        self.t = 0
        self._allocate()
        self._step = self._step_eager
        # Compiled, the step has fixed shapes (the position a tensor, the KV cache read whole with the rows after
        # t masked): one graph for every t, which a CUDA graph can replay. (With dynamic shapes instead, torch
        # 2.13's CPU code generation gave linear attention wrong logits: tests/test_decoding.py.)
        self.graph = compile
        if compile:
            mode = "reduce-overhead" if self.device.type == "cuda" else None
            self._step = torch.compile(self._step_eager, mode=mode, dynamic=False, fullgraph=True)

    # -- state ---------------------------------------------------------------------------------------------

    def _allocate(self) -> None:
        B, cap, acc = self.batch, self.capacity, self.acc
        self.states: list[Any] = []
        for layer in self.layers:
            H, D = layer.H, layer.D
            like = layer.wqkv
            if layer.kind == "linear":
                self.states.append(like.new_zeros(B * H, D, D + 1, dtype=acc))  # [S | z] of every (b, h)
            elif layer.kind == "flow":
                zeros = {f: like.new_zeros(B, H, D, dtype=acc) for f in FlowState._fields[1:5]}
                self.states.append(
                    {
                        **zeros,
                        "exp_mean": like.new_zeros(B, H, dtype=acc),
                        "kv": like.new_zeros(B, H, D, D, dtype=acc),
                    }
                )
            else:
                self.states.append((like.new_zeros(B, H, cap, D), like.new_zeros(B, H, cap, D)))
        self.values1 = self.layers[0].wqkv.new_ones(B * self.layers[0].H, 1, self.layers[0].D + 1, dtype=acc)

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
        for layer, held, layer_state in zip(self.layers, self.states, state.layers, strict=True):
            self._load(layer, held, layer_state)
        self.t = tokens.shape[1]
        return cast(torch.Tensor, logits)

    def _load(self, layer: _Layer, held: Any, state: Any) -> None:
        B, H, D = self.batch, layer.H, layer.D
        if isinstance(state, LinearState):
            held.copy_(torch.cat([state.S, state.z.unsqueeze(-1)], dim=-1).reshape(B * H, D, D + 1))
        elif isinstance(state, FlowState):
            for field, x in held.items():
                x.copy_(getattr(state, field))
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
        if self.graph:  # fixed shapes: the position is a tensor
            logits = self._step(token, torch.full((), t, device=self.device, dtype=torch.long))
        else:
            logits = self._step(token, t)
        self.t = t + 1
        return logits

    def _step_eager(self, token: torch.Tensor, t: Any) -> torch.Tensor:
        position = self.positions.index_select(0, t.view(1)) if self.graph else self.positions[t]  # (1, C) or (C,)
        x = self.embed[token] + position  # (B, C)
        for layer, state in zip(self.layers, self.states, strict=True):
            h = F.layer_norm(x, x.shape[-1:], layer.norm1.weight, layer.norm1.bias, layer.norm1.eps)
            x = x + self._attend(layer, state, h, t)  # (B, C)
            h = F.layer_norm(x, x.shape[-1:], layer.norm2.weight, layer.norm2.bias, layer.norm2.eps)
            x = x + _linear(F.gelu(_linear(h, layer.w1, layer.b1)), layer.w2, layer.b2)  # (B, C)
        norm = self.model.norm
        return F.layer_norm(x, x.shape[-1:], norm.weight, norm.bias, norm.eps) @ self.head  # (B, V)

    def _attend(self, layer: _Layer, state: Any, h: torch.Tensor, t: Any) -> torch.Tensor:
        B, H, D = h.shape[0], layer.H, layer.D
        if layer.kind == "moh":
            return self._moh(layer, state, h, t)
        qkv = _linear(h, layer.wqkv, layer.bqkv).view(B, 3, H, D)  # (B, 3, H, D)
        q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]  # (B, H, D) each
        if layer.kind == "linear":
            out = self._linear_step(layer, state, q, k, v)
        elif layer.kind == "flow":
            out = self._flow_step(layer, state, q, k, v, t)
        else:
            out = self._cached(state, q, k, v, t, None)
        return _linear(out.reshape(B, H * D).to(h.dtype), layer.wo, layer.bo)  # (B, C)

    def _linear_step(
        self, layer: _Layer, Sz: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        """S += phi(k) v^T, z += phi(k) as one rank-one update of [S | z]; out = phi(q)^T S / (phi(q)^T z + eps)."""
        B, H, D = q.shape
        acc = Sz.dtype
        phi = layer.phi
        fq = phi(q.reshape(B * H, 1, D).to(acc))  # (B H, 1, R)
        fk = phi(k.reshape(B * H, D, 1).to(acc))  # (B H, R, 1): a column
        values1 = self.values1  # (B H, 1, D + 1): [v | 1], its last column ones
        values1[..., :D] = v.reshape(B * H, 1, D)
        Sz.baddbmm_(fk, values1)  # (B H, R, D + 1), in place
        r = torch.bmm(fq, Sz)  # (B H, 1, D + 1): numerator and normaliser in one product
        return (r[..., :D] / (r[..., D:] + layer.eps)).view(B, H, D)

    def _flow_step(
        self, layer: _Layer, s: dict[str, torch.Tensor], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, t: Any
    ) -> torch.Tensor:
        """One token of causal Flow-Attention on the prefix sums held in place (as
        :func:`attnbook.flow_attention_step`)."""
        acc, eps = s["kv"].dtype, layer.eps
        n = t + 1  # the tokens seen, this one included
        qs, ks, va = torch.sigmoid(q.to(acc)), torch.sigmoid(k.to(acc)), v.to(acc)  # (B, H, D)
        s["key_sum"].add_(ks)
        s["query_sum"].add_(qs)
        incoming = ((qs + eps) * (s["key_sum"] + eps)).sum(-1) / n  # (B, H)
        outgoing = ((ks + eps) * (s["query_sum"] + eps)).sum(-1) / n
        s["key_over_outgoing"].add_(ks / outgoing.unsqueeze(-1))
        s["query_over_incoming"].add_(qs / incoming.unsqueeze(-1))
        conserved_in = ((qs + eps) * (s["key_over_outgoing"] + eps)).sum(-1) / n
        conserved_out = (((ks + eps) * (s["query_over_incoming"] + eps)).sum(-1) / n).clamp(-1.0, 1.0)
        expo = conserved_out.exp()  # (B, H)
        s["exp_mean"].add_((expo - s["exp_mean"]) / n)
        competition = expo / s["exp_mean"]
        if not layer.attn.competition:
            competition = torch.ones_like(expo)
        allocation = torch.sigmoid(conserved_in) if layer.attn.allocation else torch.ones_like(expo)
        kv = s["kv"]
        kv.add_(ks.unsqueeze(-1) * (va * competition.unsqueeze(-1)).unsqueeze(-2))  # (B, H, D, Dv)
        out = (qs.unsqueeze(-2) @ kv).squeeze(-2)  # (B, H, Dv)
        return cast(torch.Tensor, out * (allocation / (incoming * n)).unsqueeze(-1))

    def _cached(
        self,
        cache: tuple[torch.Tensor, torch.Tensor],
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        t: Any,
        scale: float | None,
    ) -> torch.Tensor:
        """The new query over the cached keys 0 .. t: row t written in place, SDPA on a view of the rows."""
        keys, values = cache
        if self.graph:  # fixed shapes: write by index, read every row, mask those after t (O(capacity) a step)
            index = t.view(1)
            keys.index_copy_(2, index, k.unsqueeze(2))
            values.index_copy_(2, index, v.unsqueeze(2))
            allowed = (torch.arange(keys.shape[2], device=keys.device) <= t).view(1, 1, 1, -1)  # (1, 1, 1, capacity)
            out = F.scaled_dot_product_attention(q.unsqueeze(2), keys, values, attn_mask=allowed, scale=scale)
        else:
            keys[:, :, t] = k
            values[:, :, t] = v
            n = t + 1
            out = F.scaled_dot_product_attention(q.unsqueeze(2), keys[:, :, :n], values[:, :, :n], scale=scale)
        return out.squeeze(2)  # (B, H, Dv)

    def _moh(self, layer: _Layer, cache: tuple[torch.Tensor, torch.Tensor], h: torch.Tensor, t: Any) -> torch.Tensor:
        """One token of MoH: the router's gates (the layer's own :meth:`~attnbook.MoHAttention.route`), the heads
        over the cache, the gated heads projected."""
        attn = layer.moh
        B, H, D = h.shape[0], layer.H, layer.D
        gates = attn.route(h.unsqueeze(1)).gates[:, 0]  # (B, H), in at least float32
        qkv = _linear(h, layer.wqkv, layer.bqkv).view(B, 3, H, D)
        q, k = attn.q_norm(qkv[:, 0]), attn.k_norm(qkv[:, 1])
        heads = self._cached(cache, q, k, qkv[:, 2], t, attn.scale)  # (B, H, D)
        gated = (heads.to(gates.dtype) * gates.unsqueeze(-1)).reshape(B, H * D)
        return _linear(attn.norm(gated).to(h.dtype), layer.wo, layer.bo)  # (B, C)

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor of the held state (for counting the memory allocated behind it)."""
        out: list[torch.Tensor] = []
        for held in self.states:
            out.extend(held.values() if isinstance(held, dict) else held if isinstance(held, tuple) else [held])
        return out

    def state(self) -> LMState:
        """The state held, as the :class:`~attnbook.lm.LMState` that :meth:`attnbook.lm.DecoderLM.step` takes."""
        layers: list[Any] = []
        B, t = self.batch, self.t
        for layer, held in zip(self.layers, self.states, strict=True):
            H, D = layer.H, layer.D
            if layer.kind == "linear":
                Sz = held.view(B, H, D, D + 1).clone()
                layers.append(LinearState(Sz[..., :D], Sz[..., D]))
            elif layer.kind == "flow":
                count = torch.full((B,), t, device=self.device, dtype=torch.int64)
                layers.append(FlowState(count, *(held[f].clone() for f in FlowState._fields[1:])))
            else:
                keys, values = held
                layers.append(KVCache.empty().extend(keys[:, :, :t], values[:, :, :t]) if t else KVCache.empty())
        return LMState(t, tuple(layers))
