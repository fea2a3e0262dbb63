"""Memory as a compiling runtime holds it (torch_spmd.runtime.set_fused_memory, TPU presets):
values made by pointwise ops (or views, or a loss gradient's one-hot) and read once are
computed inside their reader's fusion and never held, one non-elementwise op per fusion; and
in-place updates that functionalization made functional (the fused optimizer steps,
_foreach_copy_) write over the operands they replace. The values computed never change."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import torch_spmd
import torch_spmd.distributed.spmd as xs
import torch_spmd.plan as plan
import torch_spmd.runtime as xr
from torch_spmd.debug import last_step_stats
from spmd_diff import ensure_devices

TOKENS, VOCAB, D = 512, 1024, 64


@pytest.fixture(scope="module", autouse=True)
def devices():
    ensure_devices()
    yield


def lm_loss_step(device):
    """A language-model head and its loss in fp32 on 16-bit logits, forward and backward."""
    torch.manual_seed(0)
    h = torch.randn(TOKENS, D).to(device)
    w = torch.randn(VOCAB, D).div(D ** 0.5).to(torch.bfloat16).to(device).requires_grad_()
    targets = torch.randint(0, VOCAB, (TOKENS,)).to(device)
    if device != "cpu":
        mesh = xs.Mesh(np.arange(8), (8,), ("data",))
        xs.mark_sharding(h, mesh, ("data", None))
        xs.mark_sharding(targets, mesh, ("data",))
    logits = h.to(torch.bfloat16) @ w.t()
    F.cross_entropy(logits.float(), targets).backward()
    if device == "cpu":
        return w.grad
    torch_spmd.sync()
    return None if torch_spmd._C._planning() else w.grad.cpu()


def test_fused_memory_holds_no_single_use_elementwise_values_and_changes_no_value():
    expected = lm_loss_step("cpu")
    held = lm_loss_step("spmd")
    eager = last_step_stats()
    with_fusion = None
    xr.set_fused_memory(True)
    try:
        assert xr.fused_memory()
        with_fusion = lm_loss_step("spmd")
        fused = last_step_stats()
    finally:
        xr.set_fused_memory(False)
    torch.testing.assert_close(held.float(), expected.float(), rtol=2e-2, atol=2e-3)
    torch.testing.assert_close(with_fusion.float(), held.float(), rtol=0, atol=0)
    # The fp32 copy of the logits and the one-hot gradient of the loss are never held: the peak
    # drops by one [tokens, vocab] fp32 tile per device (less a few scalars that come to it).
    fp32_logits = TOKENS // 8 * VOCAB * 4
    assert eager["peak_bytes_per_device"] - fused["peak_bytes_per_device"] >= fp32_logits - 64
    assert fused["flops_per_device"] == eager["flops_per_device"]


def test_plans_on_tpu_presets_fuse_and_equal_the_executed_step_so_configured():
    xr.set_fused_memory(True)
    try:
        lm_loss_step("spmd")
        executed = last_step_stats()["peak_bytes_per_device"]
    finally:
        xr.set_fused_memory(False)
    with plan.Plan(num_devices=8, hardware="tpu-v5e"):  # XLA: fused memory by default
        lm_loss_step("spmd")
        planned = last_step_stats()["peak_bytes_per_device"]
    assert planned == executed
    with plan.Plan(num_devices=8, hardware="tpu-v5e", fused_memory=False):
        lm_loss_step("spmd")
        assert last_step_stats()["peak_bytes_per_device"] > planned
    assert not xr.fused_memory()  # restored after the plans
    with pytest.raises(ValueError, match="fused_memory must be None, True or False"):
        plan.Plan(num_devices=8, hardware="tpu-v5e", fused_memory=1)
    with pytest.raises(ValueError, match="set_fused_memory: expected True or False"):
        xr.set_fused_memory("yes")


def test_a_fused_optimizer_step_updates_its_state_in_place():
    def step(fused):
        torch.manual_seed(0)
        params = [torch.randn(256, 256).to("spmd").requires_grad_() for _ in range(4)]
        opt = torch.optim.AdamW(params, lr=1e-3, fused=fused, foreach=not fused)
        for _ in range(2):  # the second step has its state
            sum(p.pow(2).sum() for p in params).backward()
            opt.step()
            opt.zero_grad()
            torch_spmd.sync()
        return last_step_stats(), [p.cpu() for p in params]

    fused, fused_values = step(True)
    foreach, foreach_values = step(False)
    for a, b in zip(fused_values, foreach_values):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    tensor = 256 * 256 * 4
    # Parameters, gradients and two moments, with the gradients' computation and one tensor's
    # worth of slack; never a second copy of every state list at once.
    assert fused["peak_bytes_per_device"] <= 4 * 4 * tensor + 2 * tensor


def test_as_runtime_executes_with_a_presets_options_and_restores_the_sessions():
    with plan.as_runtime("tpu-v5p"):
        assert xr.fused_memory() and xr.collective_matmul_threshold() == 1 << 20
    assert not xr.fused_memory() and xr.collective_matmul_threshold() is None
    with plan.as_runtime("h100", fused_memory=True):  # torch.compile on a GPU
        assert xr.fused_memory() and xr.collective_matmul_threshold() is None
    with pytest.raises(ValueError, match="fused_memory must be None, True or False"):
        with plan.as_runtime("h100", fused_memory="on"):
            pass
