"""The mixture-of-experts block of the plan benchmarks (benchmarks/plan_models.py's MoE: top-k
routing with a capacity, one-hot dispatch and combine einsums), trained sharded as auto_shard
lays out Mixtral (the experts over 'model', the batch over 'data', expert weights stored
over 'data') and as Megatron inside every expert: equal to CPU eager."""
import copy
import os
import sys

import numpy as np
import pytest
import torch

import torch_spmd.distributed.spmd as xs

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "benchmarks"))
from helpers import sgd_losses  # noqa: E402
from plan_models import MoE  # noqa: E402

pytestmark = pytest.mark.usefixtures("eight_devices")


def _train(moe, x, device, specs=None, steps=2):
    moe = copy.deepcopy(moe).to(device)
    x = x.to(device)
    if specs:
        mesh = xs.Mesh(np.arange(8), (2, 4), ("data", "model"))
        for name, p in moe.named_parameters():
            xs.mark_sharding(p, mesh, specs[name])
        xs.mark_sharding(x, mesh, ("data", None, None))
    losses = sgd_losses(moe, lambda: moe(x).pow(2).mean(), steps, lr=0.5)
    return losses, {n: p.detach().cpu() for n, p in moe.named_parameters()}


EXPERT_PARALLEL = {"router.weight": (None, None), "w1": ("model", "data", None),
                   "w3": ("model", "data", None), "w2": ("model", None, "data")}
TENSOR_PARALLEL = {"router.weight": (None, None), "w1": (None, None, "model"),
                   "w3": (None, None, "model"), "w2": (None, "model", None)}


@pytest.mark.parametrize("specs", [EXPERT_PARALLEL, TENSOR_PARALLEL], ids=["experts", "megatron"])
def test_moe_trains_sharded_equal_to_cpu(specs):
    torch.manual_seed(0)
    # 4 experts, top 2, groups of 8 tokens with room for 5 each: some tokens are dropped
    moe = MoE(16, 24, experts=4, top_k=2, group=8)
    x = torch.randn(4, 8, 16)
    want, want_params = _train(moe, x, "cpu")
    got, got_params = _train(moe, x, "spmd", specs)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for name in want_params:
        torch.testing.assert_close(got_params[name], want_params[name], rtol=1e-5, atol=1e-6)
