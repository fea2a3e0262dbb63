"""Multi-process SPMD: one mesh over several processes (docs/multihost_spmd.md).

The same training programs (data parallel, FSDPv2, Megatron on a 2-D mesh, a spatially
sharded conv, Adam, gradient checkpointing) run on 1 process x 8 devices, 2 x 4 and 4 x 2, and
on the CPU without torch_spmd: losses and parameters must agree. Then the API (device counts,
local shards, device attributes), what crosses processes (metrics), and the failures: settings
that differ, a process that diverges, a process that dies.
"""
import os
import time

import numpy as np
import pytest
import torch

import torch_spmd.distributed.xla_multiprocessing as xmp

# Minutes of work (processes): scripts/test.sh runs it, plain pytest does not.
pytestmark = pytest.mark.slow

# A process that waits for a dead peer gives up after this many seconds (spawn stops the others
# sooner): a broken test fails instead of hanging.
os.environ.setdefault("SPMD_DIST_TIMEOUT", "60")

KINDS = ("dp", "fsdpv2", "megatron", "conv", "adam_checkpointed")
STEPS = 3


def _spawn(worker, *args, nprocs=2, devices=8, **env):
    """`worker(process_index, *args)` in a world of `nprocs` processes over `devices` devices."""
    with xmp._environ(SPMD_NUM_DEVICES=str(devices), **env):
        xmp.spawn_spmd(worker, args=args, nprocs=nprocs)


def _batch(kind, step):
    g = torch.Generator().manual_seed(100 + step)
    if kind == "conv":
        return torch.randn(4, 3, 16, 8, generator=g), torch.randn(4, 4, 16, 8, generator=g)
    return torch.randn(16, 12, generator=g), torch.randn(16, 6, generator=g)


def _model(kind):
    torch.manual_seed(0)
    if kind == "conv":
        return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Tanh(),
                                   torch.nn.Conv2d(8, 4, 3, padding=1))
    return torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.GELU(), torch.nn.Linear(32, 6))


def _train(kind, dev, spmd):
    """Losses and final parameters of STEPS steps of `kind` (on the CPU when not `spmd`)."""
    model = _model(kind)
    forward = model
    if spmd:
        import torch_spmd.core.xla_model as xm
        import torch_spmd.distributed.spmd as xs
        import torch_spmd.runtime as xr
        n = xr.global_runtime_device_count()
        model = model.to(dev)
        forward = model
        if kind == "dp":
            mesh = xs.Mesh(np.arange(n), (n,), ("data",))
            in_spec = ("data", None)
        elif kind == "fsdpv2":
            from torch_spmd.experimental.spmd_fully_sharded_data_parallel import \
                SpmdFullyShardedDataParallel as FSDPv2
            mesh = xs.Mesh(np.arange(n), (n, 1), ("fsdp", "model"))
            forward = FSDPv2(model, mesh=mesh)
            in_spec = ("fsdp", None)
        elif kind in ("megatron", "adam_checkpointed"):
            mesh = xs.Mesh(np.arange(n), (2, n // 2), ("data", "model"))
            xs.mark_sharding(model[0].weight, mesh, ("model", None))
            xs.mark_sharding(model[0].bias, mesh, ("model",))
            xs.mark_sharding(model[2].weight, mesh, (None, "model"))
            in_spec = ("data", None)
        else:  # conv: the batch over 'data', the image height over 'spatial'
            mesh = xs.Mesh(np.arange(n), (2, n // 2), ("data", "spatial"))
            in_spec = ("data", None, "spatial", None)
    if kind == "adam_checkpointed":
        inner = forward
        forward = lambda x: torch.utils.checkpoint.checkpoint(inner, x, use_reentrant=False)
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for step in range(STEPS):
        x, y = _batch(kind, step)
        x, y = x.to(dev), y.to(dev)
        if spmd:
            xs.mark_sharding(x, mesh, in_spec)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(forward(x), y)
        loss.backward()
        opt.step()
        if spmd:
            xm.mark_step()
        losses.append(loss.item())
    return losses, [p.detach().cpu() for p in model.parameters()]


def _worker(index, out_dir):
    import torch_spmd
    import torch_spmd.runtime as xr
    xr.use_spmd()
    results = {kind: _train(kind, torch_spmd.device(), True) for kind in KINDS}
    if xr.process_index() == 0:
        torch.save(results, os.path.join(out_dir, "results.pt"))


def _run_in_one_process(path):
    """1 process x 8 devices, in a child (this process's device set is the test session's)."""
    import subprocess
    import sys
    code = ("import sys, torch; sys.path.insert(0, %r); import test_multihost_spmd as t; "
            "import torch_spmd, torch_spmd.runtime as xr; xr.use_spmd(); "
            "torch.save({k: t._train(k, torch_spmd.device(), True) for k in t.KINDS}, sys.argv[1])"
            % os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, SPMD_NUM_DEVICES="8")
    subprocess.run([sys.executable, "-c", code, str(path)], check=True, env=env, timeout=600)
    return torch.load(path)


def _run_layouts(tmp_path_factory, env):
    """Results of every program on 1 x 8, 2 x 4 and 4 x 2 (processes x devices)."""
    with xmp._environ(**env):
        out = {(1, 8): _run_in_one_process(tmp_path_factory.mktemp("one") / "results.pt")}
        for nprocs in (2, 4):
            d = tmp_path_factory.mktemp(f"p{nprocs}")
            _spawn(_worker, str(d), nprocs=nprocs)
            out[(nprocs, 8 // nprocs)] = torch.load(d / "results.pt")
    return out


@pytest.fixture(scope="module")
def layouts(tmp_path_factory):
    return _run_layouts(tmp_path_factory, {})


@pytest.fixture(scope="module")
def exact_layouts(tmp_path_factory):
    # Row-exact execution (runtime/execution_plan.h): each op once per device row, no folds;
    # one intra-op thread everywhere (1 x 8 would run 2 here, and some kernels split a
    # reduction over threads).
    return _run_layouts(tmp_path_factory, {"SPMD_EXACT_ROWS": "1", "SPMD_NUM_THREADS": "1"})


@pytest.mark.parametrize("kind", KINDS)
def test_same_training_on_1x8_2x4_4x2_and_cpu(layouts, kind):
    cpu_losses, cpu_params = _train(kind, "cpu", False)
    one_losses, one_params = layouts[(1, 8)][kind]
    for layout in ((2, 4), (4, 2)):
        losses, params = layouts[layout][kind]
        # Across processes the collectives add the members in the order one process does; the
        # local kernels run over fewer stacked rows (a batched and an unbatched matmul, a
        # vectorized loop over a longer or shorter tensor, round alike to within an ulp or
        # so), hence the tight tolerance; SPMD_EXACT_ROWS=1 gives equality (below).
        np.testing.assert_allclose(losses, one_losses, rtol=1e-6, atol=0, err_msg=str(layout))
        for p, q in zip(params, one_params):
            torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7, msg=f"{kind} {layout}")
    np.testing.assert_allclose(one_losses, cpu_losses, rtol=1e-5, atol=1e-6)
    for p, q in zip(one_params, cpu_params):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
def test_row_exact_training_is_bit_identical_on_1x8_2x4_4x2(exact_layouts, layouts, kind):
    """With SPMD_EXACT_ROWS=1 a device's results do not depend on how many devices share its
    process: the same losses and parameters, bit for bit, whatever the process layout (the
    collectives across processes add members in one process's order). By default they agree
    to an ulp or so (above)."""
    losses, params = exact_layouts[(1, 8)][kind]
    for layout in ((2, 4), (4, 2)):
        other_losses, other_params = exact_layouts[layout][kind]
        assert other_losses == losses, (kind, layout)
        for p, q in zip(other_params, params):
            assert torch.equal(p, q), (kind, layout)
    # The same training as the default execution, to rounding.
    np.testing.assert_allclose(losses, layouts[(1, 8)][kind][0], rtol=1e-6)


def test_programs_are_not_all_alike(layouts):
    """The comparison above means something: the programs train (losses change) and differ."""
    for kind in KINDS:
        losses, _ = layouts[(2, 4)][kind]
        assert losses[0] != losses[-1], kind
    assert layouts[(2, 4)]["dp"][0] != layouts[(2, 4)]["conv"][0]


# ---------------------------------------------------------------------------------------------
# The API each process sees, and what crosses processes.

def _api_worker(index, out_dir):
    import torch_spmd
    import torch_spmd.core.xla_model as xm
    import torch_spmd.debug.metrics as met
    import torch_spmd.distributed.spmd as xs
    import torch_spmd.runtime as xr
    xr.use_spmd()
    n = xr.global_runtime_device_count()
    mesh = xs.Mesh(np.arange(n), (2, n // 2), ("data", "model"))
    t = torch.arange(64, dtype=torch.float32).reshape(8, 8).to(torch_spmd.device())
    xs.mark_sharding(t, mesh, ("data", "model"))
    u = (t * 2).sum(0)  # a reduction over 'data', which spans the processes
    xm.mark_step()
    met.clear_all()
    v = (t * 3).sum(0)
    w = (t * 4).sum(1)  # a reduction over 'model', within each process
    # A hybrid mesh with one slice per process: the DCN axis is the one across processes.
    hybrid = xs.HybridMesh(ici_mesh_shape=(1, n // 2), dcn_mesh_shape=(2, 1),
                           axis_names=("dcn", "ici"))
    h = (torch.arange(64, dtype=torch.float32).reshape(8, 8) - 7).to(torch_spmd.device())
    xs.mark_sharding(h, hybrid, ("dcn", "ici"))
    hd, hi = h.sum(0), h.sum(1)
    xm.mark_step()
    from torch_spmd import _C
    crossing = [(c["kind"], tuple(c["axes"]), c["crosses_processes"])
                for c in _C._last_step_stats()["collectives"]]
    shards = xs.wrap_if_sharded(t).local_shards
    # A tensor alike on every process but loaded shard by shard (devices' own values).
    s = torch.zeros(8, 8).to(torch_spmd.device())
    xs.mark_sharding(s, mesh, ("data", "model"))
    xs.wrap_if_sharded(s).load_local_shards_(
        [type(sh)(torch.full_like(sh.data, float(xr.process_index() + 1)), sh.indices,
                  sh.shard_device, sh.replica_id) for sh in shards])
    # Each process loads only its part of the batch (PyTorch/XLA's minibatch=True).
    mine = torch.arange(12, dtype=torch.float32).reshape(4, 3) + 100 * xr.process_index()
    flat = xs.Mesh(np.arange(n), (n,), ("data",))
    batch = xm.send_cpu_data_to_device(
        mine, torch_spmd.device(), xs.ShardingSpec(flat, ("data", None), minibatch=True))[0]
    try:  # the batch over 'model' would put other processes' rows on this one's devices
        xm.send_cpu_data_to_device(
            mine, torch_spmd.device(), xs.ShardingSpec(mesh, ("model", None), minibatch=True))
        bad = ""
    except ValueError as e:
        bad = str(e)
    info = {
        "batch": batch.cpu(), "bad": bad, "crossing": crossing, "w": w.cpu(),
        "hd": hd.cpu(), "hi": hi.cpu(),
        "slices": [a["slice_index"] for a in hybrid.device_attributes],
        "process": (xr.process_index(), xr.process_count()),
        "counts": (n, xr.addressable_runtime_device_count(), xr.addressable_device_count()),
        "attrs": [a["process"] for a in xr.global_runtime_device_attributes()],
        "devices": [sh.shard_device for sh in shards],
        "indices": [[(i.start, i.stop) for i in sh.indices] for sh in shards],
        "shard_values": [sh.data for sh in shards],
        "u": u.cpu(), "v": v.cpu(), "t": t.cpu(), "s": s.cpu(),
        "cross_bytes": met.metric_data("CrossProcessBytes"),
        "all_reduces": met.counter_value("CollectiveAllReduce"),
    }
    torch.save(info, os.path.join(out_dir, f"api{index}.pt"))


def test_api_local_shards_and_cross_process_bytes(tmp_path):
    _spawn(_api_worker, str(tmp_path))
    infos = [torch.load(tmp_path / f"api{p}.pt") for p in range(2)]
    t = torch.arange(64, dtype=torch.float32).reshape(8, 8)
    for p, info in enumerate(infos):
        assert info["process"] == (p, 2)
        want_batch = torch.cat([torch.arange(12.).reshape(4, 3) + 100 * q for q in range(2)])
        assert torch.equal(info["batch"], want_batch)
        assert "outside this process's part" in info["bad"], info["bad"]
        assert info["counts"] == (8, 4, 1)
        assert info["attrs"] == [0, 0, 0, 0, 1, 1, 1, 1]
        # Process p holds devices 4p..4p+3: mesh row p, i.e. rows 4p..4p+3 of t, in 2-col tiles.
        assert info["devices"] == [f"SPMD:{d}" for d in range(4 * p, 4 * p + 4)]
        assert info["indices"] == [[(4 * p, 4 * p + 4), (2 * c, 2 * c + 2)] for c in range(4)]
        for c, data in enumerate(info["shard_values"]):
            torch.testing.assert_close(data, t[4 * p:4 * p + 4, 2 * c:2 * c + 2])
        torch.testing.assert_close(info["t"], t)
        torch.testing.assert_close(info["u"], (t * 2).sum(0))
        torch.testing.assert_close(info["v"], (t * 3).sum(0))
        # Every process reads the whole value: loaded shard by shard, each process's rows.
        expected_s = torch.cat([torch.full((4, 8), 1.0), torch.full((4, 8), 2.0)])
        torch.testing.assert_close(info["s"], expected_s)
        # The step's all-reduce over 'data' crossed processes: it exchanged this process's four
        # [1, 2] partial sums (float32) with the other process, then .cpu() gathered v's shards.
        assert info["all_reduces"] >= 1
        # The reports say which collectives crossed: over 'data' yes, over 'model' no.
        assert ("all-reduce", ("data",), True) in info["crossing"], info["crossing"]
        assert ("all-reduce", ("model",), False) in info["crossing"], info["crossing"]
        torch.testing.assert_close(info["w"], (t * 4).sum(1))
        # HybridMesh: one slice per process (its DCN axis is the one across processes; the same
        # device layout as `mesh`, whose reductions above crossed over axis 0 only).
        assert info["slices"] == [0, 0, 0, 0, 1, 1, 1, 1]
        torch.testing.assert_close(info["hd"], (t - 7).sum(0))
        torch.testing.assert_close(info["hi"], (t - 7).sum(1))
        count, total, samples = info["cross_bytes"]
        assert count >= 1 and total > 0


# ---------------------------------------------------------------------------------------------
# Failures: clear errors in every process, no hang.

def _free_port():
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_mismatched_device_counts_are_an_error_in_every_process():
    """Two processes started as a launcher would (RANK, WORLD_SIZE, MASTER_*), each with its
    own SPMD_NUM_DEVICES: both fail at use_spmd(), naming every process's value."""
    import subprocess
    import sys
    port = str(_free_port())
    code = "import torch_spmd.runtime as xr; xr.use_spmd()"
    procs = []
    for rank, devices in enumerate(("8", "4")):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=port, SPMD_NUM_DEVICES=devices)
        procs.append(subprocess.Popen([sys.executable, "-c", code], env=env,
                                      stderr=subprocess.PIPE, text=True))
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode != 0
        assert "MismatchedSettingsError" in err and "different settings" in err, err
        assert "'SPMD_NUM_DEVICES': 8" in err and "'SPMD_NUM_DEVICES': 4" in err, err


def _diverging_worker(index, out_dir):
    import torch_spmd
    import torch_spmd.core.xla_model as xm
    import torch_spmd.runtime as xr
    xr.use_spmd()
    t = torch.ones(8, 4).to(torch_spmd.device())
    if xr.process_index() == 1:
        t = t + 1  # only process 1 records this: another program
    xm.mark_step()
    (t * 2).sum().item()


def test_a_diverging_process_is_reported_not_deadlocked(tmp_path):
    started = time.time()
    with pytest.raises(xmp.ProcessRaisedException, match=r"different one than process 0"):
        _spawn(_diverging_worker, str(tmp_path))
    assert time.time() - started < 120


def _dying_worker(index, out_dir):
    import torch_spmd
    import torch_spmd.core.xla_model as xm
    import torch_spmd.distributed.spmd as xs
    import torch_spmd.runtime as xr
    xr.use_spmd()
    n = xr.global_runtime_device_count()
    mesh = xs.Mesh(np.arange(n), (n,), ("data",))
    t = torch.ones(8, 4).to(torch_spmd.device())
    xs.mark_sharding(t, mesh, ("data", None))
    (t * 2).sum().item()
    if xr.process_index() == 1:
        os._exit(3)  # killed mid-training
    for _ in range(3):
        (t * 2).sum().item()


def test_a_dying_process_stops_the_others_quickly(tmp_path):
    started = time.time()
    with pytest.raises((xmp.ProcessExitedException, xmp.ProcessRaisedException)):
        _spawn(_dying_worker, str(tmp_path))
    assert time.time() - started < 120


# ---------------------------------------------------------------------------------------------
# Two "hosts": two torchruns in two network namespaces joined by a veth pair.

_HOST_SCRIPT = """
import os, sys, torch
sys.path.insert(0, {test_dir!r})
import test_multihost_spmd as t
import torch_spmd, torch_spmd.runtime as xr
xr.use_spmd()   # torchrun started several processes: this one owns its slice of the devices
results = {{k: t._train(k, torch_spmd.device(), True) for k in ("megatron", "conv")}}
if xr.process_index() == 0:
    torch.save(results, sys.argv[1])
"""


def _netns(*args):
    import subprocess
    return subprocess.run(["ip", *args], capture_output=True, text=True)


@pytest.fixture
def two_hosts():
    """Namespaces spmd_h0 (10.77.0.1) and spmd_h1 (10.77.0.2) with a veth link; None (skip)
    where network namespaces cannot be made (not root, no iproute2)."""
    from torch_spmd._impl.process_world import tcpstore_has_libuv
    if not tcpstore_has_libuv():
        pytest.skip("torchrun cannot start on a torch built without libuv (pytorch#148283)")
    names = [f"spmd_h{i}_{os.getpid()}" for i in range(2)]
    made = []
    try:
        for n in names:
            r = _netns("netns", "add", n)
            if r.returncode:
                pytest.skip(f"cannot create network namespaces here: {r.stderr.strip()}")
            made.append(n)
        links = [f"vs{os.getpid() % 100000}a", f"vs{os.getpid() % 100000}b"]
        steps = [["link", "add", links[0], "type", "veth", "peer", "name", links[1]]]
        for i, (n, link) in enumerate(zip(names, links)):
            steps += [["link", "set", link, "netns", n],
                      ["-n", n, "addr", "add", f"10.77.0.{i + 1}/24", "dev", link],
                      ["-n", n, "link", "set", link, "up"],
                      ["-n", n, "link", "set", "lo", "up"]]
        for s in steps:
            r = _netns(*s)
            assert r.returncode == 0, (s, r.stderr)
        yield list(zip(names, links, ("10.77.0.1", "10.77.0.2")))
    finally:
        for n in made:
            _netns("netns", "del", n)


def test_two_hosts_in_network_namespaces_train_as_one_process(tmp_path, two_hosts, layouts):
    import subprocess
    import sys
    script = tmp_path / "host_train.py"
    script.write_text(_HOST_SCRIPT.format(test_dir=os.path.dirname(os.path.abspath(__file__))))
    out = tmp_path / "results.pt"
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    procs = []
    for node, (ns, link, _) in enumerate(two_hosts):
        # Each host: 2 processes x 2 devices; 8 devices in all. Gloo talks over the veth.
        env = dict(os.environ, SPMD_NUM_DEVICES="8", GLOO_SOCKET_IFNAME=link,
                   SPMD_DIST_TIMEOUT="60", PYTHONPATH=repo)
        env.pop("XLA_USE_SPMD", None)
        log = open(tmp_path / f"host{node}.log", "w")
        procs.append(subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, "-m", "torch.distributed.run",
             "--nnodes=2", f"--node-rank={node}", "--nproc-per-node=2",
             f"--master-addr={two_hosts[0][2]}", "--master-port=29531", str(script), str(out)],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
    try:
        codes = [p.wait(timeout=300) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait()
    logs = "".join((tmp_path / f"host{i}.log").read_text() for i in range(2))
    assert codes == [0, 0], logs
    got = torch.load(out)
    for kind in ("megatron", "conv"):
        losses, params = got[kind]
        one_losses, one_params = layouts[(1, 8)][kind]
        np.testing.assert_allclose(losses, one_losses, rtol=1e-6, atol=0)
        for p, q in zip(params, one_params):
            torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)


# ---------------------------------------------------------------------------------------------
# Checkpoints: DCP across processes, loaded into another process count and layout.

def _ckpt_values():
    g = torch.Generator().manual_seed(7)
    return {"w": torch.randn(10, 6, generator=g), "b": torch.randn(13, generator=g),
            "r": torch.randn(3, 4, generator=g), "cpu": torch.arange(5.0), "step": 42}


def _ckpt_state(layout):
    """The values on the spmd device, each under `layout` ('save' or 'load' shardings)."""
    import torch_spmd
    import torch_spmd.distributed.spmd as xs
    import torch_spmd.runtime as xr
    n = xr.global_runtime_device_count()
    mesh = xs.Mesh(np.arange(n), (2, n // 2), ("a", "b"))
    v = _ckpt_values()
    state = {"cpu": v["cpu"], "step": v["step"]}
    specs = {"save": {"w": ("b", "a"), "b": (("a", "b"),), "r": (None, None)},
             "load": {"w": (None, ("a", "b")), "b": ("b",), "r": ("a", None)}}[layout]
    for k, spec in specs.items():
        t = v[k].to(torch_spmd.device()) if layout == "save" else \
            torch.zeros_like(v[k]).to(torch_spmd.device())
        xs.mark_sharding(t, mesh, spec)
        state[k] = t
    if layout == "load":
        state["cpu"], state["step"] = torch.zeros(5), 0
    return state


def _ckpt_save_worker(index, path):
    import torch_spmd.runtime as xr
    from torch_spmd.distributed.checkpoint import save_dcp
    xr.use_spmd()
    save_dcp(_ckpt_state("save"), path)


def _ckpt_load_worker(index, path, out_dir):
    import torch_spmd.runtime as xr
    from torch_spmd.distributed.checkpoint import load_dcp
    xr.use_spmd()
    state = _ckpt_state("load")
    load_dcp(state, path)
    got = {k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in state.items()}
    torch.save(got, os.path.join(out_dir, f"loaded{xr.process_index()}.pt"))


def test_dcp_saved_by_2_processes_loads_into_4_processes_and_the_cpu(tmp_path):
    import torch.distributed.checkpoint as dist_cp
    path = str(tmp_path / "ckpt")
    _spawn(_ckpt_save_worker, path)
    # Each process wrote its own tiles, once: two data files, chunks covering each tensor.
    files = sorted(f for f in os.listdir(path) if f.endswith(".distcp"))
    assert files == ["__0_0.distcp", "__1_0.distcp"], files
    _spawn(_ckpt_load_worker, path, str(tmp_path), nprocs=4)
    want = _ckpt_values()
    for p in range(4):
        got = torch.load(tmp_path / f"loaded{p}.pt")
        for k, v in want.items():
            if isinstance(v, torch.Tensor):
                assert torch.equal(got[k], v), (p, k)
            else:
                assert got[k] == v
    # Plain DCP (no torch_spmd planner, one process) reads it into CPU tensors.
    plain = {k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else 0
             for k, v in want.items()}
    from torch_spmd.distributed.checkpoint import _dcp
    _dcp._single_process("load", plain, storage_reader=dist_cp.FileSystemReader(path))
    for k, v in want.items():
        if isinstance(v, torch.Tensor):
            assert torch.equal(plain[k], v), k


# ---------------------------------------------------------------------------------------------
# A pod bigger than one process holds: each process's devices under the memory cap.

# 3.5 MiB per device: the model below (4 [1024, 512] float32 weights, 8 MiB, with gradients,
# SGD momentum and each layer's gathered weight in the step) peaks at 4.75 MiB per device
# sharded over 8 devices and 2.38 MiB over 16.
_CAP = "3584KiB"


def _cap_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(512, 1024, bias=False) if i % 2 == 0
                                 else torch.nn.Linear(1024, 512, bias=False) for i in range(4)])


def _fsdp_train(steps=2):
    import torch_spmd
    import torch_spmd.core.xla_model as xm
    import torch_spmd.distributed.spmd as xs
    import torch_spmd.runtime as xr
    n = xr.global_runtime_device_count()
    mesh = xs.Mesh(np.arange(n), (n,), ("fsdp",))
    model = _cap_model()
    # Uploaded shard by shard: a whole weight never sits on one device.
    spec = xs.ShardingSpec(mesh, ("fsdp", None))
    for layer in model:
        layer.weight = torch.nn.Parameter(
            xm.send_cpu_data_to_device(layer.weight.detach(), torch_spmd.device(), spec)[0])
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    losses = []
    for step in range(steps):
        x = torch.randn(n, 512, generator=torch.Generator().manual_seed(step)).to(
            torch_spmd.device())
        xs.mark_sharding(x, mesh, ("fsdp", None))
        opt.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        xm.mark_step()
        losses.append(loss.item())
    peaks = [xm.get_memory_info(f"spmd:{d}")["peak_bytes_used"]
             for d in range(xr.addressable_runtime_device_count())]
    return losses, peaks


def _cap_worker(index, out_dir):
    import torch_spmd.runtime as xr
    xr.use_spmd()
    losses, peaks = _fsdp_train()
    torch.save({"losses": losses, "peaks": peaks},
               os.path.join(out_dir, f"cap{xr.process_index()}.pt"))


def test_a_pod_too_big_for_one_process_trains_across_two(tmp_path):
    import subprocess
    import sys
    # One process of 8 devices: the sharded model does not fit a device.
    code = ("import sys; sys.path.insert(0, %r); import test_multihost_spmd as t; "
            "import torch_spmd.runtime as xr; xr.use_spmd(); t._fsdp_train()"
            % os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, SPMD_NUM_DEVICES="8", SPMD_DEVICE_MEMORY=_CAP)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode != 0 and "out of memory" in out.stderr.lower(), out.stderr[-2000:]
    # Two processes of 8 devices each (16 in all): every device stays under the cap.
    _spawn(_cap_worker, str(tmp_path), devices=16, SPMD_DEVICE_MEMORY=_CAP)
    results = [torch.load(tmp_path / f"cap{p}.pt") for p in range(2)]
    assert results[0]["losses"] == results[1]["losses"]
    for r in results:
        assert len(r["peaks"]) == 8 and 0 < max(r["peaks"]) <= 3584 * 1024, r["peaks"]
    # The same training on the CPU.
    model = _cap_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for step, got in enumerate(results[0]["losses"]):
        x = torch.randn(16, 512, generator=torch.Generator().manual_seed(step))
        opt.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        np.testing.assert_allclose(got, loss.item(), rtol=1e-5)


# ---------------------------------------------------------------------------------------------
# Sums across processes give the bits one process gives: members added in member order.

def _sum_worker(index, out_dir):
    import torch_spmd
    import torch_spmd.core.xla_model as xm
    import torch_spmd.debug.metrics as met
    import torch_spmd.distributed.spmd as xs
    import torch_spmd.runtime as xr
    xr.use_spmd()
    n = xr.global_runtime_device_count()
    rows = torch.randn(n, 1000, generator=torch.Generator().manual_seed(3))
    flat = xs.Mesh(np.arange(n), (n,), ("all",))
    grid = xs.Mesh(np.arange(n), (2, n // 2), ("data", "model"))
    x = rows.to(torch_spmd.device())
    xs.mark_sharding(x, flat, ("all", None))
    y = rows.reshape(2, n // 2, 1000).to(torch_spmd.device())
    xs.mark_sharding(y, grid, ("data", "model", None))
    met.clear_all()
    total, over_data = x.sum(0), y.sum(0)  # all-reduces over every device, and over 'data'
    xm.mark_step()
    sent = met.metric_data("CrossProcessBytes")
    torch.save({"total": total.cpu(), "over_data": over_data.cpu(),
                "sent": sent[1] if sent else 0},
               os.path.join(out_dir, f"sum{xr.process_index()}.pt"))


@pytest.mark.parametrize("nprocs", [2, 4])
def test_sums_across_processes_add_members_in_member_order(tmp_path, nprocs):
    _spawn(_sum_worker, str(tmp_path), nprocs=nprocs)
    rows = torch.randn(8, 1000, generator=torch.Generator().manual_seed(3))
    # Member order, one add at a time, as one process's all-reduce adds them.
    total = rows[0].clone()
    for m in range(1, 8):
        total += rows[m]
    grid = rows.reshape(2, 4, 1000)
    over_data = grid[0].clone()
    over_data += grid[1]
    for p in range(nprocs):
        got = torch.load(tmp_path / f"sum{p}.pt")
        assert torch.equal(got["total"], total), p
        assert torch.equal(got["over_data"], over_data), p
        # Bytes sent: a [1000] float32 value (4000 bytes) per group along the chain, and the
        # last process's sums to each other process, not every shard to everyone. 'all' (one
        # group) always chains; 'data' (4 groups of 2 devices) chains with 2 processes, but
        # with 4 its groups hold only 2 of them: its 2 shards per process go to the 3 others.
        chained = 4000 + (4 * 4000 if nprocs == 2 else 0)
        sent = chained * (nprocs - 1) if p == nprocs - 1 else chained
        if nprocs == 4:
            sent += 2 * 4000 * 3
        assert sent <= got["sent"] <= sent + 64 * nprocs, (p, got["sent"], sent)


def _ckpt_killed_worker(index, path):
    import torch_spmd.runtime as xr
    from torch_spmd.distributed.checkpoint import SPMDSavePlanner, save_dcp
    xr.use_spmd()
    state = _ckpt_state("save")
    save_dcp(state, path)  # the checkpoint to keep
    for k in ("w", "b", "r"):
        state[k] = state[k] * 2
    if xr.process_index() == 1:  # dies while writing its tiles of the second save
        SPMDSavePlanner.resolve_data = lambda self, item: os._exit(9)
    save_dcp(state, path)


def test_a_process_killed_mid_save_leaves_the_previous_checkpoint(tmp_path):
    import torch.distributed.checkpoint as dist_cp
    from torch_spmd.distributed.checkpoint import _dcp
    path = str(tmp_path / "ckpt")
    started = time.time()
    with pytest.raises((xmp.ProcessExitedException, xmp.ProcessRaisedException)):
        _spawn(_ckpt_killed_worker, path)
    assert time.time() - started < 120
    want = _ckpt_values()
    plain = {k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else 0
             for k, v in want.items()}
    _dcp.recover(path)
    _dcp._single_process("load", plain, storage_reader=dist_cp.FileSystemReader(path))
    for k, v in want.items():
        if isinstance(v, torch.Tensor):
            assert torch.equal(plain[k], v), k
        else:
            assert plain[k] == v


# ---------------------------------------------------------------------------------------------
# Plan mode inside a multi-process world plans the world's pod; the device set stays fixed.

def _plan_worker(index, out_dir):
    import torch_spmd
    import torch_spmd.distributed.spmd as xs
    import torch_spmd.core.xla_model as xm
    import torch_spmd.runtime as xr
    from torch_spmd.plan import Plan
    xr.use_spmd()
    n = xr.global_runtime_device_count()
    with Plan(hardware="tpu-v4") as plan:
        mesh = xs.Mesh(np.arange(n), (n,), ("data",))
        x = torch.randn(64, 32).to(torch_spmd.device())
        xs.mark_sharding(x, mesh, ("data", None))
        w = torch.randn(32, 16).to(torch_spmd.device())
        y = (x @ w).sum(0)
        xm.mark_step()
        report = plan.report()
    try:
        with Plan(num_devices=2 * n, hardware="tpu-v4"):
            pass
        refused = ""
    except RuntimeError as e:
        refused = str(e)
    del y
    torch.save({"collectives": report.collectives, "refused": refused},
               os.path.join(out_dir, f"plan{xr.process_index()}.pt"))


def test_plan_mode_in_a_multi_process_world(tmp_path):
    _spawn(_plan_worker, str(tmp_path))
    for p in range(2):
        got = torch.load(tmp_path / f"plan{p}.pt")
        # The planned step's all-reduce over every device crosses the processes.
        kinds = [(c["kind"], c["group_size"], c["crosses_processes"]) for c in got["collectives"]]
        assert ("all-reduce", 8, True) in kinds, kinds
        assert "owns 4 of the 8 devices" in got["refused"], got["refused"]
