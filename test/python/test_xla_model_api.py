"""torch_spmd.runtime (xr) and torch_spmd.core.xla_model (xm) in SPMD mode."""
import gc
import os

os.environ.setdefault("SPMD_NUM_DEVICES", "8")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

import torch_spmd  # noqa: E402
import torch_spmd.core.xla_model as xm  # noqa: E402
import torch_spmd.debug.metrics as met  # noqa: E402
import torch_spmd.distributed.spmd as xs  # noqa: E402
import torch_spmd.runtime as xr  # noqa: E402
from torch_spmd import _C  # noqa: E402

N = 8


pytestmark = pytest.mark.usefixtures("eight_devices")



def mesh_4x2():
    return xs.Mesh(np.arange(N), (4, 2), ("data", "model"))


# ---------------------------------------------------------------------------------------------
# runtime


def test_spmd_mode_counts():
    xr.use_spmd()
    assert xr.is_spmd()
    assert xr.global_runtime_device_count() == N == xr.addressable_runtime_device_count()
    assert (xr.global_device_count(), xr.addressable_device_count(), xr.world_size()) == (1, 1, 1)
    assert (xr.global_ordinal(), xr.local_ordinal()) == (0, 0)
    assert xr.device_type() == "SPMD"
    assert [a["name"] for a in xr.global_runtime_device_attributes()] == \
        [f"SPMD:{i}" for i in range(N)]


def test_use_spmd_auto_turns_auto_sharding_on():
    # (what it does to a step: test_auto_sharding_mode.py)
    from torch_spmd.xla import _XLAC
    assert not _XLAC._xla_get_auto_sharding()
    try:
        xr.use_spmd(auto=True)
        assert _XLAC._xla_get_auto_sharding()
    finally:
        _C._set_auto_sharding(False, {})


def test_configure_devices():
    gc.collect()
    assert _C._live_tensor_count() == 0, "a previous test leaked spmd tensors"
    mesh8 = mesh_4x2()
    try:
        xr.configure_devices(4, "1GiB")
        assert xr.global_runtime_device_count() == 4
        assert xm.get_memory_info(0)["bytes_limit"] == 2**30
        # A mesh built for 8 devices no longer maps onto the device set.
        with pytest.raises(AssertionError, match=r"\(4, 2\) is not mappable over 4 devices"):
            xs.mark_sharding(torch.randn(8, 4).to(torch_spmd.device()), mesh8, ("data", None))
        gc.collect()
        xr.configure_devices(N, 1 << 20)  # int bytes
        assert xm.get_memory_info(7)["bytes_limit"] == 1 << 20
        live = torch.randn(4).to(torch_spmd.device())
        with pytest.raises(RuntimeError, match="while .* buffers are live"):
            xr.configure_devices(4, "1GiB")
        del live
        with pytest.raises(ValueError):
            xr.configure_devices(N, "lots")
        with pytest.raises(TypeError):
            xr.configure_devices(N, 1.5)
    finally:
        gc.collect()
        xr.configure_devices(N, "16GiB")
    assert xr.global_runtime_device_count() == N


# ---------------------------------------------------------------------------------------------
# xla_model


def test_replica_helpers(capsys):
    assert xm.get_ordinal() == 0 and xm.get_local_ordinal() == 0
    assert xm.xrt_world_size() == 1
    assert xm.is_master_ordinal() and xm.is_master_ordinal(local=False)
    assert xm.xla_device_hw(xm.xla_device()) == "SPMD"
    xm.master_print("hello", 3)
    assert capsys.readouterr().out == "hello 3\n"


def _train_steps(device, barrier):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 4).to(device)
    for _ in range(2):
        opt.zero_grad()
        model(x).pow(2).sum().backward()
        if device.type == "cpu":
            opt.step()
        else:
            xm.optimizer_step(opt, barrier=barrier)
    return [p.detach().cpu() for p in model.parameters()]


def test_optimizer_step_matches_cpu():
    expected = _train_steps(torch.device("cpu"), barrier=False)
    before = met.counter_value("MarkStep") or 0
    got = _train_steps(torch_spmd.device(), barrier=True)
    assert met.counter_value("MarkStep") == before + 2  # one per barrier
    for e, g in zip(expected, got):
        assert torch.allclose(e, g, atol=1e-6)


def test_optimizer_step_passes_args_and_returns_loss():
    calls = []

    class Opt:
        def step(self, **kwargs):
            calls.append(kwargs)
            return 42

    assert xm.optimizer_step(Opt(), optimizer_args={"closure": None}) == 42
    assert calls == [{"closure": None}]


def test_save_moves_spmd_tensors_to_cpu(tmp_path):
    a = torch.randn(8, 4)
    b = torch.arange(10)
    ta = a.to(torch_spmd.device())
    xs.mark_sharding(ta, mesh_4x2(), ("data", "model"))
    tb = b.to(torch_spmd.device()) * 2  # pending
    p = torch.nn.Parameter(torch.ones(3).to(torch_spmd.device()))
    path = tmp_path / "ckpt.pt"
    xm.save({"a": ta, "nested": [tb, (1, "x")], "p": p, "cpu": b}, str(path))
    loaded = torch.load(str(path))
    assert loaded["a"].device.type == "cpu" and torch.equal(loaded["a"], a)
    assert torch.equal(loaded["nested"][0], b * 2) and loaded["nested"][1] == (1, "x")
    assert isinstance(loaded["p"], torch.nn.Parameter) and loaded["p"].device.type == "cpu"
    assert torch.equal(loaded["cpu"], b)
    assert torch_spmd.is_spmd_tensor(ta)  # the original stays on the device


def test_send_cpu_data_to_device_replicated():
    x = torch.randn(4, 2)
    out = xm.send_cpu_data_to_device(x, xm.xla_device())
    assert isinstance(out, list) and len(out) == 1
    assert torch_spmd.is_spmd_tensor(out[0]) and torch.equal(out[0].cpu(), x)
    # As PyTorch/XLA (the data is created replicated on every device and the tensor carries
    # that sharding); a plain t.to(device) has none.
    assert _C._get_sharding_spec(out[0]) == "{replicated}"
    assert _C._get_sharding_spec(x.to(xm.xla_device())) == ""
    nested = xm.send_cpu_data_to_device({"x": x, "l": [x, 3]}, xm.xla_device())
    assert torch_spmd.is_spmd_tensor(nested["x"]) and nested["l"][1] == 3
    assert torch.equal(nested["l"][0].cpu(), x)


def test_send_cpu_data_to_device_sharded_never_holds_the_whole_batch():
    gc.collect()
    x = torch.randn(64, 32)  # 8192 bytes
    spec = xs.ShardingSpec(xs.get_1d_mesh("data"), ("data", None))
    before = [xm.get_memory_info(i)["bytes_used"] for i in range(N)]
    _C._reset_peak_memory()
    out = xm.send_cpu_data_to_device([x, torch.randn(3)], xm.xla_device(), spec)
    assert _C._get_sharding_spec(out[0]) == "{devices=[8,1]0,1,2,3,4,5,6,7}"
    assert _C._get_sharding_spec(out[1]) == "{replicated}"  # rank 1: the spec does not apply
    for i in range(N):
        info = xm.get_memory_info(i)
        assert info["bytes_used"] - before[i] == 1024 + 12
        assert info["peak_bytes_used"] - before[i] == 1024 + 12
    original = x.clone()
    x.add_(1)  # the device copy does not alias the host tensor
    assert torch.equal(out[0].cpu(), original)


def test_send_cpu_data_to_device_dict_sharding():
    mesh = mesh_4x2()
    specs = {"a": xs.ShardingSpec(mesh, ("data", None)), "b": xs.ShardingSpec(mesh, (None,))}
    batch = {"a": torch.randn(8, 2), "b": torch.randn(5)}
    out = xm.send_cpu_data_to_device(batch, xm.xla_device(), specs)
    assert set(out) == {"a", "b"}
    assert _C._get_sharding_spec(out["a"]) == \
        "{devices=[4,1,2]0,1,2,3,4,5,6,7 last_tile_dim_replicate}"
    assert torch.equal(out["a"].cpu(), batch["a"]) and torch.equal(out["b"].cpu(), batch["b"])
    listed = xm.send_cpu_data_to_device([batch, batch], xm.xla_device(), specs)
    assert len(listed) == 2 and torch.equal(listed[1]["a"].cpu(), batch["a"])
    with pytest.raises(ValueError,
                       match="input batch should be a dict when input sharding is a dict."):
        xm.send_cpu_data_to_device(torch.randn(8, 2), xm.xla_device(), specs)
    with pytest.raises(KeyError, match=r"Keys: \['c'\] are missing from input_sharding."):
        xm.send_cpu_data_to_device(dict(batch, c=torch.randn(2)), xm.xla_device(), specs)


def test_send_cpu_data_to_device_minibatch():
    spec = xs.ShardingSpec(xs.get_1d_mesh("data"), ("data", None), minibatch=True)
    out = xm.send_cpu_data_to_device(torch.randn(16, 2), xm.xla_device(), spec)
    assert _C._get_sharding_spec(out[0]) == "{devices=[8,1]0,1,2,3,4,5,6,7}"
    with pytest.raises(RuntimeError, match="When minibatch is configured, the per-host batch "
                       "size must be divisible by local runtime device count"):
        xm.send_cpu_data_to_device(torch.randn(12, 2), xm.xla_device(), spec)
