"""A tensor moved to the device is held on the host until it is used or annotated, as
PyTorch/XLA's SPMD virtual device holds it: annotating lays out only its shards (no device
ever holds it whole), its first use in a graph uploads it replicated, reads while held move
nothing. Differential: values equal the host tensors; memory exact per device."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import torch_spmd
import torch_spmd.core.xla_model as xm
import torch_spmd.distributed.spmd as xs
import torch_spmd.runtime as xr
from torch_spmd import _C
from torch_spmd.debug import metrics as met

DEV = torch_spmd.device()
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _used():
    return [xm.get_memory_info(d)["bytes_used"] for d in range(xr.global_runtime_device_count())]


def _minus(a, b):
    return [x - y for x, y in zip(a, b)]


def test_held_until_first_use_then_replicated():
    xm.mark_step()
    before = _used()
    x = torch.randn(16, 8)  # 512 bytes
    t = x.to(DEV)
    assert _C._held_on_host(t) and _minus(_used(), before) == [0] * len(before)
    met.clear_metrics()
    assert torch.equal(t.cpu(), x)  # read back while held: no transfer either way
    assert met.metric_data("InboundData") is None and met.metric_data("OutboundData") is None
    y = t @ t.t()  # recorded: t is uploaded now, replicated
    assert not _C._held_on_host(t)
    assert _minus(_used(), before) == [512] * len(before)
    assert met.metric_data("OutboundData")[2] == [512.0]
    torch.testing.assert_close(y.cpu(), x @ x.t())


def test_host_writes_after_the_move_are_not_seen():
    x = torch.arange(6.0)
    t = x.to(DEV)
    x.add_(100)  # the device value was taken at .to(), as before
    assert t.cpu().tolist() == list(range(6))
    assert (t * 2).cpu().tolist() == [2.0 * i for i in range(6)]


def test_annotating_lays_out_only_the_shards():
    n = xr.global_runtime_device_count()
    xm.mark_step()
    before = _used()
    met.clear_metrics()
    x = torch.randn(n * 4, 16)
    t = x.to(DEV)
    xs.mark_sharding(t, xs.Mesh(np.arange(n), (n,)), (0, None))
    assert not _C._held_on_host(t)
    assert _minus(_used(), before) == [4 * 16 * 4] * n  # each its rows; never the whole
    assert met.metric_data("OutboundData")[2] == [float(x.nelement() * 4)]  # one transfer
    torch.testing.assert_close((t * 3).sum(0).cpu(), (x * 3).sum(0))


def test_in_place_update_and_copy_into_a_held_tensor():
    x = torch.randn(4, 4)
    t = x.to(DEV)
    t.copy_(torch.ones(4, 4))  # still a host value: held again
    assert _C._held_on_host(t)
    t.add_(1)
    xm.mark_step()
    assert not _C._held_on_host(t) and torch.equal(t.cpu(), torch.full((4, 4), 2.0))


def test_model_moved_and_sharded_trains_like_cpu():
    n = xr.global_runtime_device_count()
    mesh = xs.Mesh(np.arange(n), (n,), ("fsdp",))
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    model.load_state_dict(ref.state_dict())
    model.to(DEV)
    assert all(_C._held_on_host(p) for p in model.parameters())
    for p in (model[0].weight, model[2].weight):
        xs.mark_sharding(p, mesh, ("fsdp", None))
    opt, ref_opt = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, ref))
    x = torch.randn(8, 16)
    for _ in range(3):
        for m, o, inp in ((model, opt, x.to(DEV)), (ref, ref_opt, x)):
            o.zero_grad()
            m(inp).square().mean().backward()
            o.step()
        xm.mark_step()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.cpu(), q, rtol=1e-5, atol=1e-6)


def test_plan_mode_plans_held_tensors():
    import torch_spmd.plan as plan
    x = torch.randn(8, 8)
    t = x.to(DEV)
    with plan.Plan():
        y = (t @ t).sum()
        xm.mark_step()
        assert plan.report_last_step().predicted_step_seconds > 0
    assert torch.equal(t.cpu(), x)


SCRIPT = textwrap.dedent("""
    import numpy as np, torch
    import torch_spmd, torch_spmd.core.xla_model as xm, torch_spmd.distributed.spmd as xs
    from torch_spmd import _C
    dev = torch_spmd.device()
    x = torch.randn(1024, 256)  # 1 MiB: more than one device holds (512 KiB)
    w = x.to(dev)
    try:
        (w * 2).sum().item()    # used replicated: every device would hold it whole
        raise SystemExit("no out-of-memory error")
    except RuntimeError as e:
        assert "Out of memory" in str(e), e
    assert _C._held_on_host(w)  # the failed upload left it held, intact
    xs.mark_sharding(w, xs.Mesh(np.arange(8), (8,)), (0, None))  # 128 KiB per device
    assert max(xm.get_memory_info(d)["bytes_used"] for d in range(8)) == 128 * 1024
    torch.testing.assert_close((w * 2).sum(0).cpu(), (x * 2).sum(0))
    print("OK")
""")


def test_a_tensor_larger_than_a_device_fits_once_sharded():
    env = dict(os.environ, SPMD_DEVICE_MEMORY="512KiB", SPMD_NUM_DEVICES="8")
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and r.stdout.strip().endswith("OK"), r.stdout + r.stderr[-3000:]


def test_reconfiguring_is_refused_while_a_tensor_is_held():
    keep = torch.ones(4).to(DEV)
    assert _C._held_on_host(keep)
    with pytest.raises(RuntimeError, match="1 of them held on the host"):
        xr.configure_devices(2, "1GiB")
    assert torch.equal(keep.cpu(), torch.ones(4))
