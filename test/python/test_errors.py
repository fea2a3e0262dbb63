"""Bad input: the errors users get, and that the device stays usable after a failed step."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

import torch_spmd

from helpers import DEV

SAME_DEVICE = "Expected all tensors to be on the same device"


@pytest.mark.parametrize("name,fn", [
    ("add", lambda d, c: d + c),
    ("radd", lambda d, c: c + d),
    ("mm", lambda d, c: torch.mm(d, c.t())),
    ("cat", lambda d, c: torch.cat([d, c])),
    ("where", lambda d, c: torch.where(c > 0, d, c)),
    ("index_select", lambda d, c: d.index_select(0, torch.tensor([0, 1]))),
    ("linear_weight", lambda d, c: F.linear(d, c)),
    ("masked_fill_host_mask", lambda d, c: d.masked_fill(c > 0, 1.0)),
    ("inplace_device_self", lambda d, c: d.add_(c)),
    ("inplace_host_self", lambda d, c: c.mul_(d)),
    ("out_on_host", lambda d, c: torch.add(d, d, out=torch.empty(3, 4))),
    ("host_inputs_device_out", lambda d, c: torch.add(c, c, out=torch.empty(3, 4).to(DEV))),
    ("index_put_host_values", lambda d, c: d.index_put_((torch.tensor([0]).to(DEV),), c[0])),
])
def test_mixing_host_and_device_tensors_raises(name, fn):
    d = torch.randn(3, 4).to(DEV)
    c = torch.randn(3, 4)
    c_before = c.clone()
    with pytest.raises(RuntimeError, match=SAME_DEVICE):
        fn(d, c)
    assert torch.equal(c, c_before)  # nothing was written


def test_zero_dim_host_tensors_are_allowed_like_cuda():
    d = torch.ones(3).to(DEV)
    assert torch.equal((d * torch.tensor(2.0)).cpu(), torch.full((3,), 2.0))
    assert torch.equal(torch.where(d > 0, d, torch.tensor(0.0)).cpu(), torch.ones(3))


@pytest.mark.parametrize("fn,op,shapes", [
    (lambda: torch.mm(torch.ones(2, 3).to(DEV), torch.ones(4, 5).to(DEV)), "aten::mm",
     ["f32[2,3]", "f32[4,5]"]),
    (lambda: torch.ones(2, 3).to(DEV) + torch.ones(4, 3).to(DEV), "aten::add",
     ["f32[2,3]", "f32[4,3]"]),
    (lambda: torch.ones(2, 3).to(DEV).view(4, 2), "aten::view", ["f32[2,3]"]),
    (lambda: torch.cat([torch.ones(2, 3).to(DEV), torch.ones(2, 4).to(DEV)]), "aten::cat", []),
    (lambda: torch.bmm(torch.ones(2, 3, 4).to(DEV), torch.ones(3, 4, 5).to(DEV)), "aten::bmm",
     ["f32[2,3,4]", "f32[3,4,5]"]),
])
def test_shape_errors_name_the_op_and_inputs(fn, op, shapes):
    with pytest.raises(RuntimeError) as info:
        fn()
    msg = str(info.value)
    assert op in msg, msg
    for s in shapes:
        assert s in msg, msg


def test_failed_sync_leaves_other_tensors_usable():
    a = torch.arange(6.0).view(2, 3).to(DEV)
    b = a * 2
    torch_spmd.sync()
    good = b + 1
    bad = a[torch.tensor([0, 5]).to(DEV)]  # index out of range: only the kernel can tell
    try:
        # (CPU raises IndexError; torch_spmd._C's exception translator turns every c10 error
        # into RuntimeError.)
        with pytest.raises((IndexError, RuntimeError), match="out of bounds"):
            torch_spmd.sync()
        # Everything else is intact and still computes.
        assert torch.equal(b.cpu(), torch.arange(6.0).view(2, 3) * 2)
        assert torch.equal(good.cpu(), torch.arange(6.0).view(2, 3) * 2 + 1)
        assert torch.equal((a + b).sum().cpu(), torch.tensor(45.0))
        with pytest.raises(IndexError, match="out of bounds"):
            bad.cpu()                          # the bad value still fails when read
    finally:
        del bad                                # a pending bad value fails every mark_step
    torch_spmd.sync()                          # the next step is clean
    assert torch.equal(good.cpu(), torch.arange(6.0).view(2, 3) * 2 + 1)


OOM_SCRIPT = textwrap.dedent("""
    import torch, torch_spmd
    import torch_spmd.core.xla_model as xm
    dev = torch_spmd.device()
    a = torch.ones(16).to(dev)                 # 64 bytes per device
    b = a * 2
    torch_spmd.sync()
    used = xm.get_memory_info()["bytes_used"]
    big = torch.zeros(64, 64, device=dev) + a.sum()   # 16 KiB: does not fit in 8 KiB
    c = b + 1
    try:
        torch_spmd.sync()
        raise SystemExit("expected an out-of-memory error")
    except RuntimeError as e:
        msg = str(e)
        assert "Out of memory" in msg and "device" in msg and "16384" in msg, msg
    # Nothing leaked from the failed step; the other tensors are intact and usable.
    assert xm.get_memory_info()["bytes_used"] == used, xm.get_memory_info()
    assert torch.equal(b.cpu(), torch.full((16,), 2.0))
    assert torch.equal(c.cpu(), torch.full((16,), 3.0))
    assert torch.equal((a + b + c).cpu(), torch.full((16,), 6.0))
    try:
        big.sum().item()
        raise SystemExit("expected the big value to fail again")
    except RuntimeError:
        pass
    del big
    torch_spmd.sync()
    x = torch.randn(8, 8)
    assert torch.equal((x.to(dev) @ x.to(dev)).cpu(), x @ x)
    print("OK")
""")


def test_out_of_memory_then_recover():
    env = dict(os.environ, SPMD_DEVICE_MEMORY="8KiB", SPMD_NUM_DEVICES="2")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", OOM_SCRIPT], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), proc.stdout + proc.stderr


def test_configure_devices_refused_while_buffers_live():
    keep = torch.ones(4).to(DEV)
    with pytest.raises((RuntimeError, ValueError)):
        torch_spmd._C._configure_devices(2, 1 << 20)
    assert torch.equal(keep.cpu(), torch.ones(4))
