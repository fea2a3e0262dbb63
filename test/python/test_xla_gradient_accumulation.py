"""PyTorch/XLA's ``gradient_accumulation`` (torch_spmd.experimental.gradient_accumulation):
the same losses and gradients as the loop written by hand, on CPU and sharded."""
import pytest
import torch

import torch_spmd
import torch_spmd.distributed.spmd as xs
from torch_spmd.experimental.gradient_accumulation import gradient_accumulation

from spmd_diff import ensure_devices, mesh_of


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))


def _data(steps=4, batch=8):
    g = torch.Generator().manual_seed(1)
    return torch.randn(steps, batch, 8, generator=g), torch.randn(steps, batch, 1, generator=g)


def _by_hand(model, x, y):
    total = 0
    for i in range(x.shape[0]):
        loss = torch.nn.functional.mse_loss(model(x[i]), y[i]) / x.shape[0]
        loss.backward()
        total = total + loss.detach()
    return total


def test_equals_the_loop_by_hand_sharded_over_the_batch():
    ensure_devices()
    x, y = _data()
    ref = _model()
    want = _by_hand(ref, x, y)
    model = _model().to(torch_spmd.device())
    mesh = mesh_of((8,), ("data",))
    xd, yd = x.to(torch_spmd.device()), y.to(torch_spmd.device())
    xs.mark_sharding(xd, mesh, (None, "data", None))
    xs.mark_sharding(yd, mesh, (None, "data", None))

    def step(a, b):
        return torch.nn.functional.mse_loss(model(a), b)
    got = gradient_accumulation(step, (xd, yd), model)
    torch_spmd.sync()
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-6)
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-5, atol=1e-6)


def test_carried_tensors_thread_through_the_steps():
    x, y = _data()
    model = _model()

    def step(a, b, count):
        return torch.nn.functional.mse_loss(model(a), b), count + 1
    loss, count = gradient_accumulation(step, (x, y), model, (torch.zeros(()),))
    assert count.item() == 4 and loss.item() > 0


def test_mismatched_leading_dims_are_a_clear_error():
    x, y = _data()
    with pytest.raises(ValueError, match="same leading dim"):
        gradient_accumulation(lambda a, b: a.sum(), (x, y[:3]), _model())
