"""DecoderLM wraps in DistributedDataParallel unchanged: two CPU processes, the gloo backend.

Each process trains one SGD step on its own batch; DDP must average the gradients, so both processes end with
the same weights, and those weights equal one step on the mean of the two batches' gradients computed in a
single process.
"""

import pathlib

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from attnbook import mechanisms
from attnbook.lm import DecoderLM

WORLD = 2
MECHANISMS = mechanisms.names(causal=True)
LR = 0.1


def _model(mechanism: str) -> DecoderLM:
    torch.manual_seed(0)  # the same initial weights in every process
    return DecoderLM(mechanism, dim=16, n_heads=4, n_layers=2)


def _batch(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + rank)  # a different batch in each process
    tokens = torch.randint(256, (3, 13), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


def _loss(model, x, y):
    return F.cross_entropy(model(x).flatten(0, 1), y.flatten())


def _worker(rank: int, store: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        result = {}
        for name in MECHANISMS:
            ddp = DistributedDataParallel(_model(name))
            opt = torch.optim.SGD(ddp.parameters(), lr=LR)
            x, y = _batch(rank)
            _loss(ddp, x, y).backward()
            opt.step()
            result[name] = {k: v.detach().clone() for k, v in ddp.module.state_dict().items()}
        torch.save(result, pathlib.Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # two fresh processes import torch and DDP's torch._dynamo: several seconds
def test_ddp_averages_gradients_and_keeps_every_process_in_step(tmp_path):
    mp.spawn(_worker, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=WORLD, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]
    for name in MECHANISMS:
        # what DDP must compute: one step on the mean of the two processes' gradients
        model = _model(name)
        before = {k: v.clone() for k, v in model.state_dict().items()}
        grads = [torch.autograd.grad(_loss(model, *_batch(r)), list(model.parameters())) for r in range(WORLD)]
        expected = dict(before)
        for (k, p), *gs in zip(model.named_parameters(), *grads, strict=True):
            expected[k] = p.detach() - LR * sum(gs) / WORLD
        for k in expected:
            torch.testing.assert_close(ranks[0][name][k], ranks[1][name][k], rtol=0, atol=0, msg=f"{name} {k}")
            torch.testing.assert_close(ranks[0][name][k], expected[k], rtol=1e-5, atol=1e-6, msg=f"{name} {k}")
        moved = [k for k in expected if not torch.equal(expected[k], before[k])]
        assert len(moved) > len(expected) // 2, (name, moved)  # the step changed the weights
