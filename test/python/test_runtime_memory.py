"""Device memory behaviour of the executor and of in-place updates (single process):

- in-place updates do not pile up superseded values (torch 1.13 functionalization queue);
- an input nothing can read after a step (the old value of a tensor updated in place) is
  donated: freed after its last use in the step's program;
- view ops on a dying input are zero-copy (the input's buffer is handed to the view);
- kernel outputs are contiguous (stride-reinterpreting views read them correctly).
"""
import gc

import torch

import torch_spmd
import torch_spmd.core.xla_model as xm
import torch_spmd.debug.metrics as met
import torch_spmd.distributed.spmd as xs
from torch_spmd import _C

DEV = torch_spmd.device()
MB = 1 << 20  # a float32 [512, 512] is exactly 1 MiB


def _settle():
    xm.mark_step()
    gc.collect()


def _used():
    return xm.get_memory_info(0)["bytes_used"]


def _on_devices(host):
    """``host`` moved to the device and on every device now: a moved tensor is held on the
    host until first used (as by PyTorch/XLA's virtual device); a replicated annotation lays it
    out at once."""
    t = host.to(DEV)
    assert _C._held_on_host(t)
    xs.mark_sharding(t, xs.get_1d_mesh(), (None,) * t.dim())
    assert not _C._held_on_host(t)
    return t


def test_in_place_updates_leave_one_buffer_per_tensor():
    _settle()
    base = _used()
    t = torch.zeros(512, 512).to(DEV)
    for _ in range(3):
        for _ in range(4):
            t.add_(1.0)
        xm.mark_step()
        assert _used() - base == MB  # not one buffer per add_
    assert t.cpu()[0, 0].item() == 12.0


def test_adam_steps_keep_memory_constant():
    model = torch.nn.Linear(64, 64).to(DEV)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(4, 64).to(DEV)
    used = []
    for _ in range(4):
        opt.zero_grad(set_to_none=True)
        model(x).sum().backward()
        opt.step()
        xm.mark_step()
        used.append(_used())
    assert used[1] == used[2] == used[3]


def test_old_values_of_updated_tensors_are_donated():
    _settle()
    t = _on_devices(torch.ones(512, 512))
    xm.mark_step()
    base = _used()
    _C._reset_peak_memory()
    before = met.counter_value("DonatedInputs") or 0
    t.add_(1.0).mul_(2.0).add_(3.0)
    xm.mark_step()
    assert (met.counter_value("DonatedInputs") or 0) - before == 1
    # Without donation the old value stays to the end: 3 MiB at the second op.
    assert xm.get_memory_info(0)["peak_bytes_used"] - base == MB
    assert _used() == base
    assert t.cpu()[0, 0].item() == 7.0


def test_inputs_still_referenced_are_not_donated():
    _settle()
    a = torch.arange(10).to(DEV)
    b = a * 2            # pending, reads a
    c = b.detach() + 1   # syncing c alone must leave b's input readable
    assert c.cpu().tolist() == [2 * i + 1 for i in range(10)]
    assert b.cpu().tolist() == [2 * i for i in range(10)]
    assert a.cpu().tolist() == list(range(10))


def test_views_of_dying_values_are_zero_copy():
    _settle()
    x = _on_devices(torch.randn(512, 512))
    xm.mark_step()
    base = _used()
    _C._reset_peak_memory()
    before = met.counter_value("AliasedViews") or 0
    # Three views of a dying 1 MiB value (nothing else keeps them: a live view would keep its
    # base alive through functionalization's storage, and be an output of the step).
    z = (x * 2).reshape(-1).view(256, 1024).t() @ torch.ones(256, 1).to(DEV)
    xm.mark_step()
    assert (met.counter_value("AliasedViews") or 0) - before == 3
    assert xm.get_memory_info(0)["peak_bytes_used"] - base < MB + 64 * 1024
    want = (x.cpu() * 2).reshape(256, 1024).t() @ torch.ones(256, 1)
    torch.testing.assert_close(z.cpu(), want)


def test_transposed_operands_are_read_correctly():
    x = torch.randn(2, 3, 4)
    for f in (lambda a: a @ a.transpose(1, 2), lambda a: a.transpose(1, 2).reshape(2, 12),
              lambda a: a.permute(2, 0, 1).flatten(1)):
        torch.testing.assert_close(f(x.to(DEV)).cpu(), f(x))
