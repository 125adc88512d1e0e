"""A user's file, with the mistakes a type checker should catch.

tests/test_typing.py runs ``mypy --strict`` on it with the project's
configuration and checks that mypy reports an error on exactly the lines
marked ``# expect-error``, and on no other line: the correct uses above the
mistakes must type-check as written.
"""

import torch

from attnbook import (
    FlowAttention,
    FlowState,
    HeadRouting,
    LinearAttention,
    LinearState,
    MoHAttention,
    flow_attention,
    flow_attention_step,
    linear_attention,
    mobile_attention,
    softmax_attention,
    testing,
)

q, k, v = (torch.randn(2, 4, 16, 8) for _ in range(3))  # (B, H, N, D)
x = torch.randn(2, 10, 32)  # (B, N, C)

# Correct uses: the types that come back are the real ones.
out: torch.Tensor = flow_attention(q, k, v, is_causal=True)
out, flows = flow_attention(q, k, v, return_flows=True)
competition: torch.Tensor = flows.competition
out, state = flow_attention(q, k, v, is_causal=True, output_final_state=True)
seen: torch.Tensor = state.t
q0, k0, v0 = q[:, :, 0], k[:, :, 0], v[:, :, 0]  # one token, (B, H, D)
out_t, state = flow_attention_step(q0, k0, v0)
out, lin = linear_attention(q, k, v, is_causal=True, output_final_state=True)
S: torch.Tensor = lin.S
layer = LinearAttention(32, 32, 32, n_heads=4, causal=True)
y: torch.Tensor = layer(x)
y, layer_state = layer(x[:, :9], output_final_state=True)
ls: LinearState = layer_state
y_t, layer_state = layer.step(x[:, 9], layer_state)
flow_layer = FlowAttention(32, 32, 32, n_heads=4, causal=True)
y, fs = flow_layer(x, output_final_state=True)
flow_state: FlowState = fs
moh = MoHAttention(32, num_heads=4, shared_head=1, routed_head=2)
y, routing = moh(x, return_routing=True)
r: HeadRouting = routing
y, cache = moh(x, is_causal=True, output_final_state=True)
y_t, cache = moh.step(x[:, 0], cache)
torch.testing.assert_close(y, y, **testing.tol(torch.float32))

# Mistakes, one a line.
bad = LinearAttention(32, 32, 32, n_heads=torch.tensor(4))  # expect-error
out = flow_attention(q, k, v, causal_mask=True)  # expect-error
first = softmax_attention(q, k, v, is_causal="yes")  # expect-error
size = flow_attention(q, k, v, return_flows=True).shape  # expect-error
o, s = linear_attention(q, k, v, is_causal=True, output_final_state=True)
total = s.sum()  # expect-error
y2 = layer(x[:, :9], output_final_state=True) + 1  # expect-error
lookups = state.key_total  # expect-error
o, s2 = flow_attention_step(q0, k0, v0, lin)  # expect-error
mean = moh(x, return_routing=True).mean()  # expect-error
stats = mobile_attention(q, k, v, return_flows=True)[1]
typo = stats.competiton  # expect-error
tolerance = testing.tol("float32")  # expect-error
