"""torch_spmd.xla: PyTorch/XLA scripts run unmodified (``python -m torch_spmd.xla``,
``torch_spmd.xla.install()``), the xs names upstream exports, and MpDeviceLoader sharding.

Differential: scripts print numbers computed through ``torch_xla`` names on the emulated devices,
compared with the same computation in eager CPU torch.
"""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import torch_spmd
import torch_spmd.distributed.spmd as xs
from conftest import ensure_devices

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# torch_xla/distributed/spmd/__init__.py's __all__ at pytorch/xla
# 41398bfff334fc8d3b1c00be6ea8cc5411f6d6bf (upstream lists "MarkShardingFunction" "mark_sharding"
# without a comma between them, i.e. one string; both names are checked here).
UPSTREAM_XS_ALL = [
    "auto_policy", "XLAShard", "XLAShardedTensor", "Mesh", "HybridMesh", "ShardingType",
    "ShardingSpec", "XLAPatchedLinear", "MarkShardingFunction", "mark_sharding",
    "mark_sharding_with_gradients", "shard_as", "annotate_custom_sharding", "clear_sharding",
    "get_1d_mesh", "wrap_if_sharded", "xla_distribute_tensor", "xla_distribute_module",
    "xla_patched_nn_linear_forward", "set_global_mesh", "get_global_mesh",
    "_mark_manual_sharding", "enable_manual_sharding", "disable_manual_sharding",
    "apply_backward_optimization_barrier",
]


def _run(args, cwd, env_extra=None, timeout=300):
    env = dict(os.environ, PYTHONPATH=ROOT, SPMD_NUM_DEVICES="8")
    env.update(env_extra or {})
    return subprocess.run([sys.executable] + args, cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    import torch
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr
    import torch_xla.distributed.spmd as xs
    import torch_xla.distributed.parallel_loader as pl

    xr.use_spmd()
    n = xr.global_runtime_device_count()
    mesh = xs.Mesh(np.arange(n), (n // 2, 2), ('data', 'model'))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    data = [(torch.randn(8, 16), torch.randn(8, 4)) for _ in range(3)]
    sd = {k: v.clone() for k, v in model.state_dict().items()}

    def train(model, loader, device, shard):
        model = model.to(device)
        if shard:
            xs.mark_sharding(model[0].weight, mesh, ('model', None))
            xs.mark_sharding(model[2].weight, mesh, (None, 'model'))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        losses = []
        for x, y in loader:
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x.to(device)), y.to(device))
            loss.backward()
            opt.step()
            if shard:
                xm.mark_step()
            losses.append(loss.item())
        return losses

    loader = pl.MpDeviceLoader(data, 'xla', input_sharding=xs.ShardingSpec(mesh, ('data', None)))
    xla_losses = train(model, loader, 'xla', True)
    cpu_model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                    torch.nn.Linear(32, 4))
    cpu_model.load_state_dict(sd)
    cpu_losses = train(cpu_model, data, 'cpu', False)
    print("NAME", __name__, "ARGV", sys.argv[1:], "PATH0", sys.path[0])
    print("XLA", " ".join(f"{l:.6f}" for l in xla_losses))
    print("CPU", " ".join(f"{l:.6f}" for l in cpu_losses))
    print("SPEC", torch_xla._XLAC._get_xla_sharding_spec(model[0].weight))
""")


def _numbers(out, tag):
    line = next(l for l in out.splitlines() if l.startswith(tag + " "))
    return [float(v) for v in line.split()[1:]]


def test_script_runs_unmodified_and_matches_cpu(tmp_path):
    script = tmp_path / "train_xla.py"
    script.write_text(SCRIPT)
    r = _run(["-m", "torch_spmd.xla", str(script), "--steps", "3"], cwd=str(tmp_path.parent))
    assert r.returncode == 0, r.stdout + r.stderr
    xla, cpu = _numbers(r.stdout, "XLA"), _numbers(r.stdout, "CPU")
    assert len(xla) == len(cpu) == 3
    np.testing.assert_allclose(xla, cpu, rtol=1e-4, atol=1e-5)
    assert f"NAME __main__ ARGV ['--steps', '3'] PATH0 {tmp_path}" in r.stdout
    # model[0].weight (32, 16) sharded over 'model' (2-way) on dim 0, replicated over 'data'.
    assert "SPEC {devices=[2,1,4]" in r.stdout and "last_tile_dim_replicate" in r.stdout


def test_module_form_runs_pytest(tmp_path):
    (tmp_path / "test_upstream_style.py").write_text(textwrap.dedent("""
        import torch
        import torch_xla
        import torch_xla.distributed.spmd as xs

        def test_add():
            a = torch.arange(6.).reshape(2, 3)
            assert torch.equal((a.to('xla') * 2).cpu(), a * 2)
            assert torch_xla.device().type == 'spmd'
    """))
    r = _run(["-m", "torch_spmd.xla", "-m", "pytest", "-q", "-p", "no:cacheprovider",
              "test_upstream_style.py"], cwd=str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 passed" in r.stdout


def test_install_resolves_to_the_same_module_objects(tmp_path):
    code = textwrap.dedent("""
        import torch_spmd.xla
        torch_spmd.xla.install()
        import torch_spmd, torch_spmd.core.xla_model, torch_spmd.runtime, torch_spmd.debug.metrics
        import torch_spmd.distributed.spmd, torch_spmd.distributed.fsdp, torch_spmd.utils.checkpoint
        import torch_spmd.distributed.xla_multiprocessing, torch_spmd.distributed.parallel_loader
        import torch_spmd.experimental.spmd_fully_sharded_data_parallel
        import torch_xla
        import torch_xla.core.xla_model as xm
        import torch_xla.runtime as xr
        import torch_xla.distributed.spmd as xs
        import torch_xla.distributed.spmd.xla_sharding as xsh
        import torch_xla.distributed.spmd.xla_sharded_tensor as xst
        import torch_xla.distributed.spmd.debugging as dbg
        import torch_xla.experimental.xla_sharding as exs
        import torch_xla.debug.metrics as met
        import torch_xla.distributed.fsdp as fsdp
        import torch_xla.experimental.spmd_fully_sharded_data_parallel as fsdpv2
        import torch_xla.distributed.xla_multiprocessing as xmp
        import torch_xla.utils.checkpoint as ckpt
        import torch_xla.distributed.parallel_loader as pl
        import torch_xla.utils.utils as xu
        import torch_xla.amp as amp
        import torch_xla.distributed.xla_backend as xb
        import torch_spmd.amp, torch_spmd.distributed.xla_backend
        S = torch_spmd
        pairs = [(xm, S.core.xla_model), (xr, S.runtime), (xs, S.distributed.spmd),
                 (xsh, S.distributed.spmd.xla_sharding), (exs, S.distributed.spmd.xla_sharding),
                 (xst, S.distributed.spmd.xla_sharded_tensor), (dbg, S.distributed.spmd.debugging),
                 (met, S.debug.metrics), (fsdp, S.distributed.fsdp),
                 (fsdpv2, S.experimental.spmd_fully_sharded_data_parallel),
                 (xmp, S.distributed.xla_multiprocessing), (ckpt, S.utils.checkpoint),
                 (pl, S.distributed.parallel_loader), (torch_xla.runtime, S.runtime),
                 (amp, S.amp), (xb, S.distributed.xla_backend)]
        print("SAME", [a is b for a, b in pairs].count(True), len(pairs))
        # The real modules keep their own identity.
        print("SPEC", xs.__spec__.name, xm.__name__)
        from torch_xla.distributed.spmd import Mesh
        print("CLASS", Mesh is S.distributed.spmd.Mesh)
        xs.set_global_mesh(xs.get_1d_mesh('x'))
        print("GLOBAL", S.distributed.spmd.get_global_mesh() is xs.get_global_mesh())
        try:
            import torch_xla.experimental.scan
        except ModuleNotFoundError as e:
            print("MISSING", e.name)
        print("DEVICES", torch_xla.device(), torch_xla.devices(), xm.get_xla_supported_devices())
        import torch
        print("XLADEV", torch.ones(2, device='xla').device, torch.ones(2).to('xla').device)
        with amp.autocast(torch_xla.device()):
            print("AMP", (torch.ones(2, 3, device='xla') @ torch.ones(3, 2, device='xla')).dtype)
        torch_spmd.xla.uninstall()
        try:
            import torch_xla
            print("STILL")
        except ModuleNotFoundError:
            print("UNINSTALLED", torch.ones(1).to('cpu').device)
    """)
    r = _run(["-c", code], cwd=str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert "SAME 16 16" in out
    assert "AMP torch.bfloat16" in out
    assert "SPEC torch_spmd.distributed.spmd torch_spmd.core.xla_model" in out
    assert "CLASS True" in out and "GLOBAL True" in out
    assert "MISSING torch_xla.experimental.scan" in out
    assert "DEVICES spmd:0 [device(type='spmd', index=0)] ['spmd:0']" in out
    assert "XLADEV spmd:0 spmd:0" in out
    assert "UNINSTALLED cpu" in out


def test_install_refuses_to_shadow_a_real_torch_xla(tmp_path):
    fake = tmp_path / "site" / "torch_xla"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("REAL = True\n")
    code = textwrap.dedent("""
        import torch_spmd.xla
        try:
            torch_spmd.xla.install()
            print("INSTALLED")
        except RuntimeError as e:
            print("REFUSED", e)
        import torch_xla
        print("REAL", getattr(torch_xla, "REAL", False), torch_spmd.xla.is_installed())
    """)
    env = {"PYTHONPATH": ROOT + os.pathsep + str(tmp_path / "site")}
    r = _run(["-c", code], cwd=str(tmp_path), env_extra=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "REFUSED torch_spmd.xla.install(): a real torch_xla is installed" in r.stdout
    assert "REAL True False" in r.stdout
    # The command line refuses too, without running the script.
    script = tmp_path / "s.py"
    script.write_text("print('RAN')\n")
    r = _run(["-m", "torch_spmd.xla", str(script)], cwd=str(tmp_path), env_extra=env)
    assert r.returncode == 1 and "RAN" not in r.stdout
    assert "a real torch_xla is installed" in r.stderr


def test_upstream_xs_names_exist():
    missing = [n for n in UPSTREAM_XS_ALL if not hasattr(xs, n)]
    assert not missing
    from torch_spmd.distributed.spmd.xla_sharding import MarkShardingFunction  # noqa: F401


@pytest.fixture
def mesh8():
    ensure_devices(8)
    yield xs.Mesh(np.arange(8), (4, 2), ("data", "model"))
    xs.set_global_mesh(None)


def test_mp_device_loader_shards_batches(mesh8):
    import torch_spmd.distributed.parallel_loader as pl
    torch.manual_seed(0)
    batches = [(torch.randn(8, 6), torch.arange(8)) for _ in range(2)]
    spec = xs.ShardingSpec(mesh8, ("data", None))
    loader = pl.MpDeviceLoader(batches, torch_spmd.device(), input_sharding=spec)
    assert len(loader) == 2
    seen = 0
    for (x, y), (cx, cy) in zip(loader, batches):
        assert x.device.type == "spmd"
        assert xs.get_sharding_spec(x) == "{devices=[4,1,2]0,1,2,3,4,5,6,7 last_tile_dim_replicate}"
        assert torch_spmd._C._get_sharding_spec(x) == xs.get_sharding_spec(x)
        # The 1-D label tensor does not fit the 2-D spec: uploaded replicated (as PyTorch/XLA).
        assert xs.get_sharding_spec(y) == "{replicated}"
        # Each device holds its rows only.
        shards = xs.XLAShardedTensor(x).local_shards
        assert shards[2].data.shape == (2, 6)
        torch.testing.assert_close(shards[2].data, cx[2:4])
        torch.testing.assert_close(x.cpu(), cx)
        torch.testing.assert_close(y.cpu(), cy)
        seen += 1
    assert seen == 2

    # A dict of specs for dict batches; a key without a spec is an error, as upstream.
    dict_batches = [{"x": torch.randn(8, 4), "m": torch.ones(8, 2)}]
    loader = pl.MpDeviceLoader(dict_batches, torch_spmd.device(),
                               input_sharding={"x": spec, "m": xs.ShardingSpec(mesh8, (None, "model"))})
    (b,) = list(loader)
    assert xs.get_sharding_spec(b["x"]).startswith("{devices=[4,1,2]")
    assert xs.get_sharding_spec(b["m"]).startswith("{devices=[1,2,4]")
    torch.testing.assert_close(b["x"].cpu(), dict_batches[0]["x"])
    with pytest.raises(KeyError, match="missing from input_sharding"):
        list(pl.MpDeviceLoader(dict_batches, torch_spmd.device(), input_sharding={"x": spec}))


def test_mark_sharding_with_gradients_values_and_grad_sharding(mesh8):
    torch.manual_seed(0)
    w_cpu = torch.randn(8, 6, requires_grad=True)
    w = w_cpu.detach().to(torch_spmd.device()).requires_grad_()
    y = xs.mark_sharding_with_gradients(w * 3, mesh8, ("data", None))
    assert xs.get_sharding_spec(w) == ""  # not in place
    (y.sin().sum()).backward()
    (w_cpu * 3).sin().sum().backward()
    torch.testing.assert_close(y.detach().cpu(), (w_cpu * 3).detach())
    torch.testing.assert_close(w.grad.cpu(), w_cpu.grad)


def test_patched_linear_matches_nn_linear(mesh8):
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    model = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    model.load_state_dict(ref.state_dict())
    model = model.to(torch_spmd.device())
    weight = model[0].weight
    xs.apply_xla_patch_to_nn_linear(model)
    assert isinstance(model[0], xs.EinsumLinear) and model[0].weight is weight
    x = torch.randn(8, 3, 6)
    xd = x.to(torch_spmd.device())
    xs.mark_sharding(xd, mesh8, ("data", None, None))
    out = model(xd)
    out.square().sum().backward()
    r = ref(x)
    r.square().sum().backward()
    torch.testing.assert_close(out.detach().cpu(), r.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(model[0].weight.grad.cpu(), ref[0].weight.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(model[2].bias.grad.cpu(), ref[2].bias.grad, rtol=1e-5, atol=1e-5)


def test_shard_as_copies_a_sharding(mesh8):
    a = torch.randn(8, 4).to(torch_spmd.device())
    b = torch.randn(8, 4).to(torch_spmd.device())
    xs.mark_sharding(a, mesh8, ("data", "model"))
    xs.shard_as({"t": a}, {"t": b})
    assert xs.get_sharding_spec(b) == xs.get_sharding_spec(a) != ""
    with pytest.raises(AssertionError, match="same structure"):
        xs.shard_as([a], (b,))


def test_manual_sharding_through_the_xlac_conversions(mesh8):
    # PyTorch/XLA's test_manual_sharding_e2e, through the _XLAC names install() provides.
    from torch_spmd.xla import _XLAC
    x0 = torch.randn(8, 4)
    x = x0.to(torch_spmd.device())
    xs.mark_sharding(x, mesh8, ("data", None))
    xx = _XLAC._spmd_full_to_shard_shape(x)
    assert xx.shape == (8 // mesh8.mesh_shape[0], 4)
    yy = xs._mark_manual_sharding(xx + 1)
    y = _XLAC._spmd_shard_to_full_shape(yy.global_tensor, mesh8.get_op_sharding(("data", None)),
                                        x.shape, x.dtype)
    assert y.shape == (8, 4)
    assert torch.allclose(y.cpu(), x0 + 1)
    with pytest.raises(RuntimeError, match="needs a tensor with a tiled sharding"):
        _XLAC._spmd_full_to_shard_shape(torch.zeros(8, 8).to(torch_spmd.device()))


@pytest.mark.parametrize("spec", [("data", None), ("data", "model"), (None, "model"),
                                  ("model", "data"), (None, None)])
def test_global_tensor_from_cpu_shards_reassembles_each_devices_padded_shard(mesh8, spec):
    """PyTorch/XLA's _global_tensor_from_cpu_shards: each device's shard (taken here from a
    sharded tensor's local_shards, padded to the tile shape with NaN that must not show)
    gives back the tensor, laid out as the sharding says."""
    from torch_spmd.xla import _XLAC
    full = torch.arange(60, dtype=torch.float32).reshape(10, 6)  # 10 rows over 4: padded
    t = full.to(torch_spmd.device())
    xs.mark_sharding(t, mesh8, spec)
    sharding = mesh8.get_op_sharding(spec)
    tiles = [mesh8.mesh_shape[mesh8.get_axis_name_idx(a)] if a else 1 for a in spec]
    padded = [-(-d // k) for d, k in zip(full.shape, tiles)]
    shards = [None] * 8
    for shard in xs.XLAShardedTensor(t).local_shards:
        data = torch.full(padded, float("nan"))
        data[tuple(slice(0, n) for n in shard.data.shape)] = shard.data
        shards[int(shard.shard_device.split(":")[-1])] = data
    got = _XLAC._global_tensor_from_cpu_shards(shards, sharding, full.shape)
    assert torch.equal(got.cpu(), full)
    assert xs.get_sharding_spec(got) == xs.get_sharding_spec(t)
    with pytest.raises(RuntimeError, match="one per device"):
        _XLAC._global_tensor_from_cpu_shards(shards[:-1], sharding, full.shape)
    too_big = [d * k + 1 for d, k in zip(padded, tiles)]
    with pytest.raises(RuntimeError, match="has shards of shape"):
        _XLAC._global_tensor_from_cpu_shards(shards, sharding, too_big)


def test_manual_sharding_on_one_device_takes_the_whole_tensor_as_its_shard():
    """On a one-device mesh every spec is {replicated}: the manual region's shard is the whole
    tensor, as PyTorch/XLA's CPU CI runs test_manual_sharding_e2e (a fresh process: the device
    set cannot shrink under this module's live tensors)."""
    code = textwrap.dedent("""
        import numpy as np, torch, torch_spmd
        import torch_spmd.distributed.spmd as xs
        from torch_spmd.xla import _XLAC
        mesh = xs.Mesh(np.arange(1), (1, 1))
        x0 = torch.randn(8, 8)
        x = x0.to(torch_spmd.device())
        xs.mark_sharding(x, mesh, (0, 1))
        xx = _XLAC._spmd_full_to_shard_shape(x)
        assert xx.shape == (8, 8), xx.shape
        yy = xs._mark_manual_sharding(xx + 1)
        spec = mesh.get_op_sharding((0, 1))
        assert spec == "{replicated}", spec
        y = _XLAC._spmd_shard_to_full_shape(yy.global_tensor, spec, x.shape, x.dtype)
        torch.testing.assert_close(y.cpu(), x0 + 1)
        print("ok")
    """)
    env = dict(os.environ, SPMD_NUM_DEVICES="1",
               PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]


def test_profiler_trace_annotations_are_real_and_the_service_is_not_faked(mesh8):
    # torch_xla.debug.profiler resolves to torch_spmd.debug.profiler under install().
    import torch_spmd.debug.profiler as xp
    t = torch.randn(8, 4).to(torch_spmd.device())
    with torch.profiler.profile() as prof:
        with xp.StepTrace("train_step"):
            with xp.Trace("build_graph"):
                u = t * 2 + 1

        @xp.trace_me("decorated")
        def f():
            return t - 1

        f()
    names = {e.name for e in prof.events()}
    assert {"train_step", "build_graph", "decorated"} <= names
    assert xp.get_tracer_marked_step()
    torch.testing.assert_close(u.cpu(), t.cpu() * 2 + 1)
    for call in (lambda: xp.start_server(9012), lambda: xp.trace("localhost:9012", "/tmp/x"),
                 lambda: xp.trace_detached("localhost:9012", "/tmp/x"),
                 lambda: xp.start_trace("/tmp/x"), xp.stop_trace):
        with pytest.raises(NotImplementedError, match="no XLA profiler service"):
            call()


def test_step_trace_ends_the_step(mesh8):
    import torch_spmd.debug.metrics as met
    import torch_spmd.debug.profiler as xp
    t = torch.randn(4).to(torch_spmd.device())
    torch_spmd.sync()
    before = met.counter_value("ExecuteGraph") or 0
    with xp.StepTrace("step"):
        u = t * 3
    assert (met.counter_value("ExecuteGraph") or 0) == before + 1  # ran at the exit
    torch.testing.assert_close(u.cpu(), t.cpu() * 3)


def test_pjrt_device_cpu_names_the_emulated_devices_cpu(monkeypatch):
    """PyTorch/XLA's CPU runs set PJRT_DEVICE=CPU and read it back (xla_device_hw, device
    strings, skipIf device_type() == 'CPU'); other values name hardware that is not here."""
    import torch_spmd.runtime as xr
    import torch_spmd.core.xla_model as xm
    monkeypatch.delenv("PJRT_DEVICE", raising=False)
    assert xr.device_type() == "SPMD"
    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    assert xr.device_type() == "CPU"
    assert xm.xla_device_hw(xm.xla_device()) == "CPU"
    assert xm.xla_real_devices([xm.xla_device()]) == ["CPU:0"]
    assert xm.xla_replication_devices([xm.xla_device()]) == [
        f"CPU:{i}" for i in range(xr.global_runtime_device_count())]
    monkeypatch.setenv("PJRT_DEVICE", "TPU")
    assert xr.device_type() == "SPMD"


def test_hlo_text_carries_shardings_in_xla_notation(mesh8):
    """_get_xla_tensors_hlo answers with torch_spmd's program text, each value's sharding as
    XLA's `sharding={...}` attribute (what upstream's sharding assertions look for)."""
    from torch_spmd.xla import _XLAC
    t = torch.randn(16, 16).to(torch_spmd.device())
    mesh = xs.Mesh(np.arange(8), (2, 4, 1))
    xs.mark_sharding(t, mesh, (2, 1))
    hlo = _XLAC._get_xla_tensors_hlo([t + 1])
    assert "sharding={devices=[1,4,2]" in hlo
    assert "%custom-call" not in hlo  # (no XLA instruction names are made up)


def test_lowering_context_names_the_data_a_graph_reads_without_moving_it(mesh8):
    """_XLAC.lowering.LoweringContext: build() lowers the pending work of some tensors (nothing
    runs); its parameters are the device data that work reads, handed back as device tensors
    sharing that data (no transfer), numbered as tensor_parameter_id says; hlo_text() is the
    graph's text with XLA's sharding attributes."""
    import torch_spmd.core.xla_model as xm
    import torch_spmd.debug.metrics as met
    from torch_spmd.xla import _XLAC, xla_builder
    dev = torch_spmd.device()
    a, b, c = torch.randn(32, 16), torch.randn(16), torch.randn(16)
    ad, bd, cd = a.to(dev), b.to(dev), c.to(dev)
    xs.mark_sharding(ad, mesh8, ("data", "model"))
    xs.mark_sharding(bd, mesh8, ("model",))
    xm.mark_step()
    met.clear_all()
    out = ad * 2 + bd
    ctx = _XLAC.lowering.LoweringContext("MyName")
    ctx.build([out])
    mapping = ctx.device_parameter_id_tensor_mapping()
    assert sorted(mapping) == [0, 1]
    ids = [ctx.tensor_parameter_id(t) for t in (ad, bd)]
    assert sorted(ids) == [0, 1]
    assert ctx.tensor_parameter_id(cd) == -1 and ctx.tensor_parameter_id(out) == -1
    for t, i in zip((ad, bd), ids):
        assert mapping[i].device.type == "spmd"
        assert _XLAC._get_xla_sharding_spec(mapping[i]) == _XLAC._get_xla_sharding_spec(t)
    assert not met.metric_data("TransferFromDeviceTime")  # (nothing read back)
    assert "aten::" in torch_spmd._C._graph_text([out])    # (nothing ran)
    text = ctx.hlo_text()
    assert "MyName" in text and "sharding={devices=[4,2]" in text
    comp = xla_builder.computation_from_module_proto("c", ctx.hlo())
    assert xla_builder.get_computation_hlo(comp) == text
    host = ctx.parameter_id_tensor_mapping()
    torch.testing.assert_close(host[ids[0]], a)
    torch.testing.assert_close(host[ids[1]], b)
    torch.testing.assert_close(out.cpu(), a * 2 + b)
    with pytest.raises(ValueError, match=r"tensors\[0\] is a tensor on cpu"):
        ctx.build([a])
    with pytest.raises(RuntimeError, match="call build"):
        _XLAC.lowering.LoweringContext().hlo_text()
    with pytest.raises(AttributeError, match="does not build XLA HLO op by op"):
        xla_builder.Op


def test_input_output_alias_count_counts_donated_inputs(mesh8):
    """An in-place update of a sharded tensor gives its old buffer to the new value: one run,
    one aliased input (PyTorch/XLA's InputOutputAliasCount)."""
    import torch_spmd.core.xla_model as xm
    import torch_spmd.debug.metrics as met
    t = torch.arange(8.0).reshape(1, 8).to(torch_spmd.device())
    xs.mark_sharding(t, xs.Mesh(np.arange(8), (1, 8)), (0, 1))
    xm.mark_step()
    met.clear_all()
    t += 1
    xm.mark_step()
    assert met.metric_data("InputOutputAliasCount")[0] == 1
    torch.testing.assert_close(t.cpu(), torch.arange(8.0).reshape(1, 8) + 1)


def test_distribute_module_with_auto_policy_moves_the_module_and_auto_shards(mesh8):
    """xla_distribute_module(partition_fn=auto_policy), as PyTorch/XLA's: auto-sharding on, the
    module on the device; a step trains equal to CPU."""
    import torch_spmd.core.xla_model as xm
    from torch_spmd.distributed.spmd import auto_policy, xla_distribute_module
    torch.manual_seed(0)
    cpu = torch.nn.Linear(16, 8)
    model = torch.nn.Linear(16, 8)
    model.load_state_dict(cpu.state_dict())
    try:
        model = xla_distribute_module(model, None, auto_policy)
        assert all(p.device.type == "spmd" for p in model.parameters())
        assert torch_spmd._C._auto_sharding()
        x = torch.randn(32, 16)
        loss = model(x.to(torch_spmd.device())).pow(2).sum()
        loss.backward()
        xm.mark_step()
        cpu(x).pow(2).sum().backward()
        torch.testing.assert_close(model.weight.grad.cpu(), cpu.weight.grad, rtol=1e-5, atol=1e-5)
    finally:
        torch_spmd._C._set_auto_sharding(False, {})


def test_tensor_debug_info_reports_device_shape_sharding_and_data(mesh8):
    from torch_spmd.xla import _XLAC
    # (torch.tensor(data, device=...) is device data at once, as an upload is: its lift_fresh
    # records nothing, so mark_sharding lays the data out.)
    t = torch.tensor([[0.0, 1, 2, 3, 4, 5, 6, 7]], device=torch_spmd.device())
    st = xs.mark_sharding(t, xs.Mesh(np.arange(8), (1, 8)), (0, 1))
    info = _XLAC._get_xla_tensor_debug_info(st.global_tensor)
    for field in ("XLAShardedData", "Data Device: SPMD:0", "XLA Shape: f32[1,8]",
                  "OpSharding: {devices=[1,8]0,1,2,3,4,5,6,7}", "NumShards: 8",
                  "IR: xla::device_data()", "Tensor on host: None"):
        assert field in info, (field, info)
    pending = _XLAC._get_xla_tensor_debug_info(t + 1)
    assert "IR: aten::add.Tensor" in pending and "XLAData: None" in pending
    # Moved and not used yet: held on the host (PyTorch/XLA's virtual device), then uploaded
    # replicated by its first use.
    held = torch.ones(3, 2).to(t.device)
    info = _XLAC._get_xla_tensor_debug_info(held)
    for field in ("ShardingSpec: None", "IR: None", "XLAData: None",
                  "Tensor on host: with size [3, 2]"):
        assert field in info, (field, info)
    used = held * 2
    info = _XLAC._get_xla_tensor_debug_info(held)
    for field in ("IR: xla::device_data()", "XLAData: ", "OpSharding: {replicated}",
                  "Tensor on host: None"):
        assert field in info, (field, info)
    assert used.cpu().tolist() == [[2.0, 2.0]] * 3


def test_laying_out_device_data_is_not_a_transfer(mesh8):
    """mark_sharding of device data moves it between the devices: OutboundData counts the
    upload once (PyTorch/XLA's test_outbound_data_metrics bounds it below two uploads)."""
    import torch_spmd.debug.metrics as met
    met.clear_all()
    t = torch.tensor([[1.0, 2, 3, 4, 5, 6, 7, 8]], device=torch_spmd.device())
    xs.mark_sharding(t, xs.Mesh(np.arange(8), (1, 8)), (0, 1))
    assert met.metric_data("OutboundData")[1] == t.nelement() * t.element_size()
    assert met.metric_data("InboundData") is None
    torch.testing.assert_close(t.cpu(), torch.arange(1.0, 9).reshape(1, 8))
