"""Selective activation checkpointing (torch.utils.checkpoint with a context_fn policy, as
torchtitan runs it): gradients equal CPU eager's, the saved ops are not recomputed (FLOPs between
no checkpointing and full recomputation), and plan mode plans the same step."""
import functools

import pytest
import torch
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

import torch_spmd.core.xla_model as xm
import torch_spmd.distributed.spmd as xs
import torch_spmd.plan as plan
import torch_spmd.utils.checkpoint as spmd_checkpoint
from torch_spmd.debug import last_step_stats
from spmd_diff import ensure_devices, mesh_of


@pytest.fixture(scope="module", autouse=True)
def devices():
    ensure_devices()
    yield


def save_matmuls(ctx, op, *args, **kwargs):
    """torchtitan's selective policy in small: keep matmul results, recompute the rest."""
    if op in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default):
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def block(x, w1, w2):
    return x + torch.nn.functional.gelu(x @ w1) @ w2


def train_step(device, remat, mesh=None, checkpoint=checkpoint):
    """Two blocks, each checkpointed as `remat` says; returns the three gradients on the host."""
    torch.manual_seed(0)
    x, w1, w2 = torch.randn(16, 8), torch.randn(8, 32), torch.randn(32, 8)
    x, w1, w2 = (t.to(device).requires_grad_() for t in (x, w1, w2))
    if mesh is not None:
        xs.mark_sharding(x, mesh, ("x", None))
        xs.mark_sharding(w1, mesh, (None, "x"))
    h = x
    for _ in range(2):
        if remat == "none":
            h = block(h, w1, w2)
        elif remat == "full":
            h = checkpoint(block, h, w1, w2, use_reentrant=False)
        else:
            context = functools.partial(create_selective_checkpoint_contexts, save_matmuls)
            h = checkpoint(block, h, w1, w2, use_reentrant=False, context_fn=context)
    h.pow(2).sum().backward()
    grads = [x.grad, w1.grad, w2.grad]
    if device != "cpu":
        xm.mark_step()
    return grads


def test_selective_checkpointing_matches_cpu_eager():
    mesh = mesh_of((8,))
    expected = train_step("cpu", "selective")
    got = train_step("spmd", "selective", mesh)
    for e, g in zip(expected, got):
        torch.testing.assert_close(g.cpu(), e, rtol=1e-4, atol=1e-4)
    # and checkpointing changes nothing in the numbers
    for e, g in zip(train_step("cpu", "none"), expected):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)


def test_saved_ops_are_not_recomputed_and_plan_equals_executed():
    mesh = mesh_of((8,))
    flops = {}
    for remat in ("none", "selective", "full"):
        train_step("spmd", remat, mesh)
        flops[remat] = last_step_stats()["flops_per_device"]
    # The matmuls dominate: selective recomputes only the GELUs.
    assert flops["none"] < flops["selective"] < flops["full"], flops
    assert flops["selective"] - flops["none"] < (flops["full"] - flops["none"]) / 4, flops
    hw = dict(peak_flops_bf16=1e12, hbm_bytes=16 << 30, hbm_bandwidth=1e11, ring_bandwidth=1e10)
    with plan.Plan(hardware=hw):
        train_step("spmd", "selective", mesh)
        planned = last_step_stats()
    assert planned["flops_per_device"] == flops["selective"]


def test_torch_spmd_checkpoint_takes_torchs_selective_policy():
    # PyTorch/XLA's checkpoint wrapper, with torch's non-reentrant keyword arguments: the same
    # gradients and the same recomputation as torch.utils.checkpoint.
    mesh = mesh_of((8,))
    expected = train_step("cpu", "selective")
    got = train_step("spmd", "selective", mesh, checkpoint=spmd_checkpoint.checkpoint)
    wrapped = last_step_stats()["flops_per_device"]
    for e, g in zip(expected, got):
        torch.testing.assert_close(g.cpu(), e, rtol=1e-4, atol=1e-4)
    train_step("spmd", "selective", mesh)
    assert wrapped == last_step_stats()["flops_per_device"]
    x = torch.randn(4, requires_grad=True)
    context = functools.partial(create_selective_checkpoint_contexts, save_matmuls)
    with pytest.raises(ValueError, match="only supported when use_reentrant=False"):
        spmd_checkpoint.checkpoint(torch.sin, x, context_fn=context)
    with pytest.raises(ValueError, match="Unexpected keyword arguments: colour"):
        spmd_checkpoint.checkpoint(torch.sin, x, use_reentrant=False, colour=1)
