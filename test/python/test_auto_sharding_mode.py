"""xr.use_spmd(auto=True): a script that annotates nothing gets layouts chosen by the cost
model, per graph (aten/auto_sharding.h, plan/auto_layout.h). Differential against CPU
eager, with the chosen layouts and their collectives checked."""
import copy

import numpy as np
import pytest
import torch
import torch.nn as nn

import torch_spmd.core.xla_model as xm
import torch_spmd.debug.metrics as met
import torch_spmd.distributed.spmd as xs
import torch_spmd.runtime as xr
from torch_spmd import _C
from torch_spmd.plan import Plan, report_last_step

from helpers import sgd_losses

pytestmark = pytest.mark.usefixtures("eight_devices")


@pytest.fixture(autouse=True)
def auto_off_after(monkeypatch):
    monkeypatch.delenv("XLA_AUTO_SPMD_MESH", raising=False)
    yield
    _C._set_auto_sharding(False, {})


def _train(model, x, y, device, steps=4):
    model = copy.deepcopy(model).to(device)
    x, y = x.to(device), y.to(device)
    return sgd_losses(model, lambda: nn.functional.mse_loss(model(x), y), steps, lr=0.1), model


def _mlp(dim, hidden):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))


def _tiled(t):
    return "devices=" in _C._get_sharding_spec(t)


def test_weights_dominating_get_sharded_and_train_equal_to_cpu():
    # 8 rows against a 1024 -> 4096 -> 1024 MLP: the weights' update, not the batch, is
    # what costs; replicated, every device does all of it
    model, x, y = _mlp(1024, 4096), torch.randn(8, 1024), torch.randn(8, 1024)
    want, cpu_model = _train(model, x, y, "cpu")
    _train(model, x, y, "spmd", steps=2)
    replicated = report_last_step("tpu-v4").predicted_step_seconds
    met.clear_counters()
    xr.use_spmd(auto=True)
    got, spmd_model = _train(model, x, y, "spmd")
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    for p, q in zip(spmd_model.parameters(), cpu_model.parameters()):
        torch.testing.assert_close(p.cpu(), q, rtol=1e-4, atol=1e-5)
    # searched once for the first step, once for the steady one (parameters now laid out)
    assert 1 <= met.counter_value("CompileWithAutoSharding") <= 3
    w1, w2 = spmd_model[0].weight, spmd_model[2].weight
    assert _tiled(w1) and _tiled(w2), (_C._get_sharding_spec(w1), _C._get_sharding_spec(w2))
    # and the cost model's reason: the step it predicts is shorter than replicated's
    assert report_last_step("tpu-v4").predicted_step_seconds < replicated


def test_small_steps_stay_replicated():
    # 8 x 256 -> 2048 -> 256: microseconds of work; any collective costs more
    model, x, y = _mlp(256, 2048), torch.randn(8, 256), torch.randn(8, 256)
    xr.use_spmd(auto=True)
    _, spmd_model = _train(model, x, y, "spmd", steps=2)
    assert not any(_tiled(p) for p in spmd_model.parameters())


def test_batch_dominating_is_planned_data_parallel():
    # 65536 rows through a 256 -> 1024 -> 256 MLP: the matmuls dominate, gradients are 2 MB
    xr.use_spmd(auto=True, hardware="tpu-v5p")
    with Plan(num_devices=8, hardware="tpu-v5p") as plan:
        model = _mlp(256, 1024).to("spmd")
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.zeros(65536, 256, device="spmd")
        xm.mark_step()
        for _ in range(2):
            model(x).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
            xm.mark_step()
        r = plan.report()
    # every device computes an eighth of the batch, and the gradients are summed over them
    assert r.flops_per_device < r.model_flops / 4, (r.flops_per_device, r.model_flops)
    assert any(c["kind"] in ("all-reduce", "reduce-scatter") for c in r.collectives), r.collectives


def test_annotated_tensors_keep_their_layout():
    xr.use_spmd(auto=True)
    mesh = xs.Mesh(np.arange(8), (8,), ("data",))
    w = torch.randn(64, 64).to("spmd")
    x = torch.randn(8, 64).to("spmd")
    xs.mark_sharding(w, mesh, (None, "data"))
    y = x @ w
    xm.mark_step()
    torch.testing.assert_close(y.cpu(), x.cpu() @ w.cpu())
    assert "devices=[1,8]" in _C._get_sharding_spec(w)


def test_graph_hash_changes_with_auto_and_its_mesh(monkeypatch):
    t = torch.ones(2, 2).to("spmd")
    plain = _C._get_graph_hash([t + 0])
    assert _C._get_graph_hash([t + 0]) == plain
    xr.use_spmd(auto=True)
    auto = _C._get_graph_hash([t + 0])
    monkeypatch.setenv("XLA_AUTO_SPMD_MESH", "4,2")
    assert len({plain, auto, _C._get_graph_hash([t + 0])}) == 3


@pytest.mark.parametrize("mesh, message", [
    ("4,4", r'XLA_AUTO_SPMD_MESH="4,4" has 16 devices, but there are 8'),
    ("4,x", r'XLA_AUTO_SPMD_MESH must be positive integers separated by commas, like "4,2"; got "4,x"'),
])
def test_bad_auto_mesh_raises_a_value_error_naming_it(monkeypatch, mesh, message):
    xr.use_spmd(auto=True)
    monkeypatch.setenv("XLA_AUTO_SPMD_MESH", mesh)
    x = torch.randn(8, 8).to("spmd")
    y = x + 1
    with pytest.raises(ValueError, match=message):
        xm.mark_step()
    monkeypatch.delenv("XLA_AUTO_SPMD_MESH")
    torch.testing.assert_close(y.cpu(), x.cpu() + 1)  # the failed step left y recomputable


def test_two_d_auto_mesh_trains_equal_to_cpu(monkeypatch):
    monkeypatch.setenv("XLA_AUTO_SPMD_MESH", "2,4")
    model, x, y = _mlp(1024, 4096), torch.randn(8, 1024), torch.randn(8, 1024)
    want, _ = _train(model, x, y, "cpu")
    xr.use_spmd(auto=True)
    got, spmd_model = _train(model, x, y, "spmd")
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert any(_tiled(p) for p in spmd_model.parameters())


def test_plan_mode_plans_the_chosen_layouts():
    xr.use_spmd(auto=True, hardware="tpu-v5p")
    with Plan(num_devices=8, hardware="tpu-v5p") as plan:
        w1 = torch.zeros(4096, 16384, device="spmd", requires_grad=True)
        w2 = torch.zeros(16384, 4096, device="spmd", requires_grad=True)
        x = torch.zeros(8, 4096, device="spmd")
        xm.mark_step()
        ((x @ w1).relu() @ w2).sum().backward()
        xm.mark_step()
        r = plan.report()
    # 512 MiB of weights against a 128 KiB batch: read replicated, every device reads all of
    # them; sharded, an eighth (and their gradients are an eighth)
    assert r.peak_bytes_per_device[0] < 4096 * 16384 * 4, r.peak_bytes_per_device
