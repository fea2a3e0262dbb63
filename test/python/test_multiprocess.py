"""Multi-process mode: xmp.spawn, torchrun, the xm replica APIs and their collectives over gloo,
and autograd through those collectives.

Each replica derives its inputs from its ordinal (``_inputs``), runs the collectives in one
lazy step and saves what it got; the parent recomputes every expected result from all replicas'
inputs with torch on the CPU. Processes are few (2 or 4) and tensors tiny: the machine is small.
"""
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch

import torch_spmd  # noqa: F401
import torch_spmd.core.xla_model as xm
import torch_spmd.distributed as tsd
import torch_spmd.distributed.xla_multiprocessing as xmp
from torch_spmd._impl.process_world import tcpstore_has_libuv

# Minutes of work (processes, examples, sweeps): scripts/test.sh runs it, plain pytest does not.
pytestmark = pytest.mark.slow

# Replicas that wait for a dead peer give up after this many seconds (the parent stops them
# sooner): a broken test fails instead of hanging.
os.environ.setdefault("SPMD_DIST_TIMEOUT", "60")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _inputs(rank):
    """Replica `rank`'s inputs: distinct per replica, exact in float32."""
    x = torch.arange(32, dtype=torch.float32).reshape(4, 8) * (rank + 1) + 100 * rank
    return {
        "x": x,
        "y": (torch.arange(8, dtype=torch.float32) - 3) * (rank - 1.5),
        "i": torch.tensor([rank, 10 - rank, 3 * rank], dtype=torch.int64),
        "b": (torch.arange(4, dtype=torch.float32) * (rank + 1)).to(torch.bfloat16),
    }


def _save(out_dir, rank, results):
    torch.save({k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in results.items()},
               os.path.join(out_dir, f"rank{rank}.pt"))


def _load(out_dir, world):
    return [torch.load(os.path.join(out_dir, f"rank{r}.pt")) for r in range(world)]


# ---------------------------------------------------------------------------------------------
# Every collective, with and without groups, in one step of 4 replicas.

def _collectives_worker(index, out_dir):
    import torch_spmd.debug.metrics as met
    import torch_spmd.distributed.spmd as xs
    import torch_spmd.runtime as xr
    from torch_spmd import _C

    dev = torch_spmd.device()
    rank, world = xm.get_ordinal(), xm.xrt_world_size()
    assert index == rank
    host = _inputs(rank)
    x, y, i, b = (host[k].to(dev) for k in ("x", "y", "i", "b"))
    r = {}
    r["sum"] = xm.all_reduce(xm.REDUCE_SUM, x, scale=0.5)
    r["max"] = xm.all_reduce(xm.REDUCE_MAX, x)
    r["min"] = xm.all_reduce(xm.REDUCE_MIN, y)
    r["bf16"] = xm.all_reduce(xm.REDUCE_SUM, b)
    inplace = [x * 1, y * 1, i * 1]  # two dtypes: two coalesced buckets
    assert xm.all_reduce(xm.REDUCE_SUM, inplace) is inplace
    r["inplace_x"], r["inplace_y"], r["inplace_i"] = inplace
    r["gather0"] = xm.all_gather(x, dim=0)
    r["gather_last"] = xm.all_gather(x, dim=-1)
    out = torch.zeros(16, 8).to(dev)
    assert xm.all_gather(x, output=out) is out
    r["gather_out"] = out
    r["rs"] = xm.reduce_scatter(xm.REDUCE_SUM, x, 0.25, 0, world)
    r["rs1"] = xm.reduce_scatter(xm.REDUCE_MAX, x, 1.0, 1, world)
    r["a2a"] = xm.all_to_all(x, 1, 0, world)
    r["a2a_same"] = xm.all_to_all(y, 0, 0, world)
    # Groups: strided, unsorted member order, adjacent pairs.
    r["g_sum"] = xm.all_reduce(xm.REDUCE_SUM, x, groups=[[0, 2], [1, 3]])
    r["g_gather"] = xm.all_gather(y, groups=[[1, 0], [3, 2]])
    r["g_rs"] = xm.reduce_scatter(xm.REDUCE_SUM, x, 1.0, 0, 2, groups=[[0, 1], [2, 3]])
    r["g_a2a"] = xm.all_to_all(x, 0, 1, 2, groups=[[0, 3], [1, 2]])
    r["alone"] = xm.all_reduce(xm.REDUCE_SUM, y, groups=[[0], [1], [2], [3]])  # no traffic
    # SPMD sharding inside a replica (a one-device mesh) mixes with replica collectives: the
    # partitioner's collectives stay on this process's devices.
    a = host["y"].reshape(2, 4).to(dev)
    xs.mark_sharding(a, xs.Mesh(np.arange(1), (1,), ("x",)), (None, "x"))
    r["sharded"] = xm.all_reduce(xm.REDUCE_SUM, (a @ a.T).sum(0))
    r["errors"] = _argument_errors(x)
    graph = _C._graph_text([r["sum"], r["gather0"], r["rs"], r["a2a"], r["inplace_x"]])
    before = {k: met.counter_value(k) or 0 for k in
              ("CollectiveAllReduce", "CollectiveAllGather", "CollectiveReduceScatter",
               "CollectiveAllToAll")}
    assert met.metric_data("CollectiveAllGatherBytes") is None
    xm.mark_step()
    counts = {k: (met.counter_value(k) or 0) - v for k, v in before.items()}
    r["counts"] = counts
    r["all_gather_bytes"] = met.metric_data("CollectiveAllGatherBytes")[1]
    r["graph"] = graph
    r["info"] = (rank, xm.get_local_ordinal(), world, xm.is_master_ordinal(),
                 xm.is_master_ordinal(local=False), xr.world_size(), xr.global_ordinal(),
                 xr.process_count(), xr.global_runtime_device_count())
    r["rendezvous"] = xm.rendezvous("done", str(rank).encode())
    r["rendezvous_pair"] = xm.rendezvous("pair", b"p%d" % rank, replicas=[rank - rank % 2,
                                                                          rank - rank % 2 + 1])
    _save(out_dir, rank, r)


def _argument_errors(x):
    """What bad arguments raise (at record time, before anything runs)."""
    errors = {}
    for name, call in {
        "repeated": lambda: xm.all_gather(x, groups=[[0, 1, 1, 2, 3]]),
        "shard_count": lambda: xm.reduce_scatter(xm.REDUCE_SUM, x, 1.0, 0, 3),
        "indivisible": lambda: xm.reduce_scatter(xm.REDUCE_SUM, x[:3], 1.0, 0, 4),
        "split_count": lambda: xm.all_to_all(x, 0, 1, 2),
        "reduce_type": lambda: xm.all_reduce(xm.REDUCE_MUL, x),
    }.items():
        try:
            call()
            errors[name] = None
        except Exception as e:  # noqa: BLE001
            errors[name] = f"{type(e).__name__}: {e}"
    return errors


def _expected_collectives(world):
    ins = [_inputs(r) for r in range(world)]
    xs = torch.stack([d["x"] for d in ins])
    ys = torch.stack([d["y"] for d in ins])
    exp = []
    for rank in range(world):
        e = {}
        e["sum"] = xs.sum(0) * 0.5
        e["max"] = xs.max(0).values
        e["min"] = ys.min(0).values
        e["bf16"] = torch.stack([d["b"].float() for d in ins]).sum(0).to(torch.bfloat16)
        e["inplace_x"], e["inplace_y"] = xs.sum(0), ys.sum(0)
        e["inplace_i"] = torch.stack([d["i"] for d in ins]).sum(0)
        e["gather0"] = torch.cat(list(xs), 0)
        e["gather_last"] = torch.cat(list(xs), 1)
        e["gather_out"] = e["gather0"]
        e["rs"] = (xs.sum(0) * 0.25).chunk(world, 0)[rank]
        e["rs1"] = xs.max(0).values.chunk(world, 1)[rank]
        e["a2a"] = torch.cat([xs[s].chunk(world, 1)[rank] for s in range(world)], 0)
        e["a2a_same"] = torch.cat([ys[s].chunk(world, 0)[rank] for s in range(world)], 0)
        strided = [0, 2] if rank % 2 == 0 else [1, 3]
        e["g_sum"] = xs[strided].sum(0)
        order = [1, 0] if rank < 2 else [3, 2]
        e["g_gather"] = torch.cat([ys[m] for m in order], 0)
        pair = [0, 1] if rank < 2 else [2, 3]
        e["g_rs"] = xs[pair].sum(0).chunk(2, 0)[pair.index(rank)]
        grp = [0, 3] if rank in (0, 3) else [1, 2]
        e["g_a2a"] = torch.cat([xs[s].chunk(2, 0)[grp.index(rank)] for s in grp], 1)
        e["alone"] = ys[rank]
        e["sharded"] = sum((y.reshape(2, 4) @ y.reshape(2, 4).T).sum(0) for y in ys)
        exp.append(e)
    return exp


def test_collectives_match_reference_4_processes(tmp_path):
    world = 4
    start = time.monotonic()
    xmp.spawn(_collectives_worker, args=(str(tmp_path),), nprocs=world)
    got = _load(str(tmp_path), world)
    for rank, (g, e) in enumerate(zip(got, _expected_collectives(world))):
        for key, want in e.items():
            assert g[key].dtype == want.dtype, (rank, key)
            torch.testing.assert_close(g[key], want, rtol=0, atol=0, msg=f"rank {rank} {key}")
        assert g["info"] == (rank, rank, world, rank == 0, rank == 0, world, rank, world, 1)
        assert g["rendezvous"] == [b"0", b"1", b"2", b"3"]
        assert g["rendezvous_pair"] == ([b"p0", b"p1"] if rank < 2 else [b"p2", b"p3"])
        # Every collective ran once in the step, counted like the in-process ones: all_reduce
        # 4 single + 2 buckets of the list + 2 grouped + 1 after the sharded matmul + the
        # partitioner's own (in-process, group of one) for that matmul's partial sum; gather
        # 3 + 1; scatter 2 + 1; a2a 2 + 1.
        assert g["counts"] == {"CollectiveAllReduce": 10, "CollectiveAllGather": 4,
                               "CollectiveReduceScatter": 3, "CollectiveAllToAll": 3}
        assert g["all_gather_bytes"] == 3 * 4 * 8 * 4 + 8 * 4  # each input's bytes, per run
        for op in ("xm::all_reduce", "xm::all_gather", "xm::reduce_scatter", "xm::all_to_all"):
            assert op in g["graph"]
        assert "groups=[0,1,2,3], group_size=4" in g["graph"]
        err = g["errors"]
        assert err["repeated"].startswith("ValueError") and "exactly once" in err["repeated"]
        assert "shard_count=3 must equal the group size 4" in err["shard_count"]
        assert "does not split evenly into 4 chunks" in err["indivisible"]
        assert "split_count=2 must equal the group size 4" in err["split_count"]
        assert "not supported" in err["reduce_type"]
    assert time.monotonic() - start < 30


# ---------------------------------------------------------------------------------------------
# optimizer_step: data parallel training equals full-batch training.

STEPS, LR, BATCH = 3, 0.1, 8


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def _batch():
    g = torch.Generator().manual_seed(1)
    return torch.randn(STEPS, BATCH, 4, generator=g), torch.randn(STEPS, BATCH, 2, generator=g)


def _train_worker(index, out_dir):
    import torch_spmd.debug.metrics as met
    dev = torch_spmd.device()
    rank, world = xm.get_ordinal(), xm.xrt_world_size()
    model = _model().to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    xs, ys = _batch()
    per = BATCH // world
    for step in range(STEPS):
        x = xs[step, rank * per:(rank + 1) * per].to(dev)
        y = ys[step, rank * per:(rank + 1) * per].to(dev)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        xm.optimizer_step(opt)
        xm.mark_step()
        if step == STEPS - 2:
            compiles = met.counter_value("UncachedCompile")
    results = {n: p.detach() for n, p in model.named_parameters()}
    results["last_step_compiles"] = met.counter_value("UncachedCompile") - compiles
    _save(out_dir, rank, results)


def _sgd_by_hand(world):
    """Each replica's gradients computed on the CPU, averaged by hand, then SGD with momentum."""
    model = _model()
    params = list(model.parameters())
    bufs = [None] * len(params)
    xs, ys = _batch()
    per = BATCH // world
    for step in range(STEPS):
        grads = [torch.zeros_like(p) for p in params]
        for r in range(world):
            model.zero_grad()
            x, y = xs[step, r * per:(r + 1) * per], ys[step, r * per:(r + 1) * per]
            torch.nn.functional.mse_loss(model(x), y).backward()
            for g, p in zip(grads, params):
                g += p.grad / world
        with torch.no_grad():
            for k, (p, g) in enumerate(zip(params, grads)):
                bufs[k] = g.clone() if bufs[k] is None else bufs[k] * 0.9 + g
                p -= LR * bufs[k]
    return dict(model.named_parameters())


def _full_batch():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    xs, ys = _batch()
    for step in range(STEPS):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(xs[step]), ys[step]).backward()
        opt.step()
    return dict(model.named_parameters())


def test_optimizer_step_equals_full_batch_2_processes(tmp_path):
    world = 2
    xmp.spawn(_train_worker, args=(str(tmp_path),), nprocs=world)
    got = _load(str(tmp_path), world)
    by_hand, full = _sgd_by_hand(world), _full_batch()
    for name, want in full.items():
        for rank in range(world):
            torch.testing.assert_close(got[rank][name], want.detach(), rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(got[rank][name], by_hand[name].detach(), rtol=1e-5,
                                       atol=1e-6)
        assert torch.equal(got[0][name], got[1][name])  # replicas stay identical
    # A steady-state step (same graph, collectives included) is served by the compile cache.
    assert [g["last_step_compiles"] for g in got] == [0, 0]
    # Training changed the parameters (the test would pass vacuously otherwise).
    assert not torch.allclose(full["0.weight"], _model()[0].weight)


# ---------------------------------------------------------------------------------------------
# Autograd through the collectives. Replica r's loss depends on its collective's output; the
# gradient each replica gets for its input must be the gradient of the sum of all replicas'
# losses, which the parent computes on the CPU with the collectives written as torch ops.

GRAD_WORLD = 4


def _grad_input(rank):
    """Distinct random values: MAX / MIN have a unique winner per element."""
    return torch.randn(4, 8, generator=torch.Generator().manual_seed(10 + rank))


def _replica_loss(rank, y):
    """Replica `rank`'s loss of its collective output: depends on the rank and on y."""
    w = torch.linspace(-1.0, 1.0, y.numel()).reshape(y.shape).to(y.device) * (rank + 1)
    return (y * w).sum() + 0.5 * (y * y).sum()


def _chain_weight(rank):
    return torch.linspace(-0.5, 0.5, 8 * 4).reshape(8, 4) + rank


def _group_of(groups, rank):
    return next(g for g in groups if rank in g)


def _grad_cases(n):
    """key -> (what replica `rank` computes from its x, the CPU reference: every replica's x
    -> every replica's output)."""
    ordered, strided = [[1, 0], [3, 2]], [[0, 2], [1, 3]]
    return {
        "sum": (lambda r, x: xm.all_reduce(xm.REDUCE_SUM, torch.tanh(x), scale=0.5),
                lambda xs: [0.5 * sum(torch.tanh(x) for x in xs)] * n),
        "max": (lambda r, x: xm.all_reduce(xm.REDUCE_MAX, x, scale=2.0),
                lambda xs: [2.0 * torch.stack(xs).amax(0)] * n),
        "gather": (lambda r, x: xm.all_gather(torch.tanh(x), dim=1),
                   lambda xs: [torch.cat([torch.tanh(x) for x in xs], 1)] * n),
        "rs_sum": (lambda r, x: xm.reduce_scatter(xm.REDUCE_SUM, x, 0.25, 0, n),
                   lambda xs: list((0.25 * sum(xs)).chunk(n, 0))),
        "rs_min": (lambda r, x: xm.reduce_scatter(xm.REDUCE_MIN, x, 1.0, -1, n),
                   lambda xs: list(torch.stack(xs).amin(0).chunk(n, 1))),
        "a2a": (lambda r, x: xm.all_to_all(x, 1, 0, n),
                lambda xs: [torch.cat([x.chunk(n, 1)[r] for x in xs], 0) for r in range(n)]),
        "g_gather": (lambda r, x: xm.all_gather(x, 0, groups=ordered),
                     lambda xs: [torch.cat([xs[m] for m in _group_of(ordered, r)], 0)
                                 for r in range(n)]),
        "g_rs": (lambda r, x: xm.reduce_scatter(xm.REDUCE_SUM, x, 1.0, 0, 2, groups=strided),
                 lambda xs: [sum(xs[m] for m in _group_of(strided, r)).chunk(2, 0)[
                     _group_of(strided, r).index(r)] for r in range(n)]),
        # Sequence-parallel style: gather the rows, a replica-specific matmul, reduce-scatter.
        "chain": (lambda r, x: xm.reduce_scatter(
                      xm.REDUCE_SUM, xm.all_gather(x, 0) @ _chain_weight(r).to(x.device), 1.0,
                      0, n),
                  lambda xs: list(sum(torch.cat(xs, 0) @ _chain_weight(r)
                                      for r in range(n)).chunk(n, 0))),
    }


# Data-parallel training whose losses need the collectives' gradients: a contrastive loss over
# all replicas' features (all_gather), a centering penalty around the global mean feature
# (all_reduce) and a penalty on the global Gram matrix, each replica holding one row of it
# (reduce_scatter). Full-batch CPU training with the mean of the replicas' losses must match.

DP_ROWS = 2  # rows per replica


def _feature_model():
    torch.manual_seed(3)
    return torch.nn.Linear(4, GRAD_WORLD)


def _feature_batches():
    g = torch.Generator().manual_seed(4)
    return torch.randn(2, GRAD_WORLD * DP_ROWS, 4, generator=g)  # two steps


def _dp_loss(rank, f, gather, all_reduce, reduce_scatter):
    n = GRAD_WORLD
    contrastive = torch.nn.functional.cross_entropy(
        f @ gather(f).T, torch.arange(DP_ROWS).to(f.device) + DP_ROWS * rank)
    centered = ((f - all_reduce(f.sum(0), 1.0 / (n * DP_ROWS))) ** 2).mean()
    gram_row = reduce_scatter(f.T @ f, 1.0 / (n * DP_ROWS))
    return contrastive + centered + (gram_row ** 2).sum()


def _grad_worker(index, out_dir):
    dev = torch_spmd.device()
    rank, n = xm.get_ordinal(), xm.xrt_world_size()
    results = {}
    loss = 0
    leaves = {}
    for key, (replica_fn, _) in _grad_cases(n).items():
        leaves[key] = _grad_input(rank).to(dev).requires_grad_()
        y = replica_fn(rank, leaves[key])
        assert y.requires_grad, key
        results["y_" + key] = y.detach()
        loss = loss + _replica_loss(rank, y)
    loss.backward()
    xm.mark_step()
    for key, leaf in leaves.items():
        results["grad_" + key] = leaf.grad
    # Outside autograd the collectives record no backward.
    with torch.no_grad():
        assert not xm.all_gather(leaves["sum"]).requires_grad

    model = _feature_model().to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for batch in _feature_batches():
        opt.zero_grad()
        f = torch.tanh(model(batch[rank * DP_ROWS:(rank + 1) * DP_ROWS].to(dev)))
        _dp_loss(rank, f, lambda t: xm.all_gather(t, 0),
                 lambda t, s: xm.all_reduce(xm.REDUCE_SUM, t, scale=s),
                 lambda t, s: xm.reduce_scatter(xm.REDUCE_SUM, t, s, 0, n)).backward()
        xm.optimizer_step(opt)
        xm.mark_step()
    results.update({"dp_" + k: p.detach() for k, p in model.named_parameters()})
    _save(out_dir, rank, results)


def _full_batch_features(cut=False):
    """The same training on the CPU over the full batch: the loss is the mean of what the
    replicas' losses are, written with the whole feature matrix. ``cut``: the collectives'
    results as constants (gradients stop there, as after PyTorch/XLA's xm collectives)."""
    n = GRAD_WORLD
    model = _feature_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for batch in _feature_batches():
        opt.zero_grad()
        f = torch.tanh(model(batch))
        g = f.detach() if cut else f
        losses = [_dp_loss(r, f[r * DP_ROWS:(r + 1) * DP_ROWS], lambda t: g,
                           lambda t, s: g.sum(0) * s,
                           lambda t, s, r=r: ((g.T @ g) * s)[r:r + 1])
                  for r in range(n)]
        (sum(losses) / n).backward()
        opt.step()
    return dict(model.named_parameters())


def test_collectives_are_differentiable_4_processes(tmp_path):
    n = GRAD_WORLD
    xmp.spawn(_grad_worker, args=(str(tmp_path),), nprocs=n)
    got = _load(str(tmp_path), n)
    for key, (_, reference) in _grad_cases(n).items():
        xs = [_grad_input(r).requires_grad_() for r in range(n)]
        ys = reference(xs)
        sum(_replica_loss(r, y) for r, y in enumerate(ys)).backward()
        for r in range(n):
            torch.testing.assert_close(got[r]["y_" + key], ys[r].detach(), rtol=1e-5,
                                       atol=1e-5, msg=f"rank {r} {key} forward")
            torch.testing.assert_close(got[r]["grad_" + key], xs[r].grad, rtol=1e-5, atol=1e-5,
                                       msg=f"rank {r} {key} gradient")
    full = _full_batch_features()
    for name, want in full.items():
        for r in range(n):
            torch.testing.assert_close(got[r]["dp_" + name], want.detach(), rtol=1e-5,
                                       atol=1e-6, msg=f"rank {r} {name}")
    # The collectives' gradients matter: without them training goes elsewhere.
    cut = _full_batch_features(cut=True)
    assert not torch.allclose(full["weight"], cut["weight"], rtol=1e-3, atol=1e-4)


# ---------------------------------------------------------------------------------------------
# Failures and the launch environment.

def _failing_worker(index):
    dev = torch_spmd.device()
    xm.all_reduce(xm.REDUCE_SUM, torch.ones(2).to(dev)).cpu()
    if index == 1:
        raise ValueError("boom from replica 1")
    # Replica 0 waits in a collective for a peer that is gone: spawn must not hang on it.
    xm.all_reduce(xm.REDUCE_SUM, torch.ones(2).to(dev)).cpu()
    time.sleep(60)


def test_child_exception_reaches_parent_without_hanging():
    start = time.monotonic()
    with pytest.raises(xmp.ProcessRaisedException, match="boom from replica 1") as info:
        xmp.spawn(_failing_worker, nprocs=2)
    assert isinstance(info.value, RuntimeError)
    assert "Traceback" in str(info.value) and "_failing_worker" in str(info.value)
    assert info.value.error_index == 1
    assert time.monotonic() - start < 30


def _exit_worker(index):
    if index == 0:
        os._exit(3)
    time.sleep(60)


def test_child_exit_code_reaches_parent_through_join():
    context = xmp.spawn(_exit_worker, nprocs=2, join=False)
    assert len(context.pids()) == 2
    with pytest.raises(xmp.ProcessExitedException, match="process 0 terminated with exit code 3"):
        while not context.join():
            pass
    assert all(not p.is_alive() for p in context.processes)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _port_worker(index, out_dir):
    port = int(os.environ["MASTER_PORT"])
    listening = None
    if index == 0:  # the store that replica 0 hosts holds the port
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                listening = False
            except OSError:
                listening = True
    _save(out_dir, index, {"port": port, "listening": listening,
                           "addr": os.environ["MASTER_ADDR"]})


def test_master_port_env_is_honored(tmp_path, monkeypatch):
    port = _free_port()
    monkeypatch.setenv("MASTER_PORT", str(port))
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    parent_env = dict(os.environ)
    xmp.spawn(_port_worker, args=(str(tmp_path),), nprocs=2)
    got = _load(str(tmp_path), 2)
    assert [g["port"] for g in got] == [port, port]
    assert [g["addr"] for g in got] == ["127.0.0.1"] * 2
    assert got[0]["listening"] is True
    assert dict(os.environ) == parent_env  # the replicas' variables never leak into the parent


_LAUNCHER = textwrap.dedent("""
    import os, sys, torch, torch_spmd
    import torch_spmd.core.xla_model as xm
    import torch_spmd.distributed.xla_multiprocessing as xmp

    def work(index, out_dir):
        total = xm.all_reduce(xm.REDUCE_SUM, torch.tensor([float(index)]).to(torch_spmd.device()))
        with open(os.path.join(out_dir, f"replica{index}"), "w") as f:
            f.write(f"{xm.get_ordinal()} {xm.get_local_ordinal()} {xm.xrt_world_size()} "
                    f"{total.cpu().item()}")

    if __name__ == "__main__":
        # fork: the launcher has not started any device work, and the replicas skip
        # re-importing torch (the machine running the tests is small).
        xmp.spawn(work, args=(sys.argv[1],), nprocs=2, start_method="fork")
""")


def test_two_launchers_form_one_world(tmp_path):
    """Two launchers with RANK/WORLD_SIZE (as on two machines) make one world of 4 replicas."""
    script = tmp_path / "launch.py"
    script.write_text(_LAUNCHER)
    env = dict(os.environ, PYTHONPATH=REPO, MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(_free_port()), WORLD_SIZE="2")
    procs = [subprocess.Popen([sys.executable, str(script), str(tmp_path)],
                              env=dict(env, RANK=str(r), LOCAL_RANK="0"))
             for r in range(2)]
    try:
        assert [p.wait(timeout=30) for p in procs] == [0, 0]
    finally:
        for p in procs:
            p.kill()
    for replica in range(4):
        rank, local, world, total = (tmp_path / f"replica{replica}").read_text().split()
        assert (int(rank), int(local), int(world), float(total)) == (replica, replica % 2, 4, 6.0)


# ---------------------------------------------------------------------------------------------
# torchrun: every worker it starts is one replica. The script trains as _train_worker does; the
# parent compares the parameters with full-batch training on the CPU.

_TORCHRUN_SCRIPT = textwrap.dedent("""
    import os, sys
    import torch, torch.distributed as dist
    import torch_spmd
    import torch_spmd.core.xla_model as xm
    import torch_spmd.distributed as tsd
    import torch_spmd.distributed.xla_multiprocessing as xmp
    import torch_spmd.runtime as xr
    from test_multiprocess import BATCH, LR, STEPS, _batch, _model

    def train(index, out_dir):
        dev = torch_spmd.device()
        rank, world = xm.get_ordinal(), xm.xrt_world_size()
        model = _model().to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
        xs, ys = _batch()
        per = BATCH // world
        for step in range(STEPS):
            opt.zero_grad()
            x = xs[step, rank * per:(rank + 1) * per].to(dev)
            y = ys[step, rank * per:(rank + 1) * per].to(dev)
            torch.nn.functional.mse_loss(model(x), y).backward()
            xm.optimizer_step(opt)
            xm.mark_step()
        out = {n: p.detach().cpu() for n, p in model.named_parameters()}
        out["ranks"] = xm.all_gather(torch.tensor([float(rank)]).to(dev)).cpu()
        out["info"] = (index, rank, xm.get_local_ordinal(), world, xr.process_count(),
                       xr.global_runtime_device_count(), int(os.environ["RANK"]),
                       int(os.environ["LOCAL_RANK"]), tsd.is_multiprocess(),
                       os.environ["SCRIPT_PID"] == str(os.getpid()))  # no child process
        out["rendezvous"] = xm.rendezvous("done", str(rank).encode())
        torch.save(out, os.path.join(out_dir, f"rank{rank}.pt"))

    if __name__ == "__main__":
        mode, out_dir = sys.argv[1], sys.argv[2]
        os.environ["SCRIPT_PID"] = str(os.getpid())
        if mode == "spawn":  # PyTorch/XLA style: runs in the worker under torchrun
            xmp.spawn(train, args=(out_dir,))
            assert not tsd.is_multiprocess() and not dist.is_initialized()
        elif mode == "xla":  # PyTorch/XLA's backend: the process joins the world over it
            import torch_spmd.distributed.xla_backend  # noqa: F401
            dist.init_process_group("xla", init_method="xla://")
            assert dist.get_backend() == "xla" and tsd.is_multiprocess()
            train(xm.get_ordinal(), out_dir)
            tsd.shutdown_multiprocess()
            dist.destroy_process_group()
        else:  # the script's own gloo group, then torch_spmd joins it
            dist.init_process_group("gloo")
            tsd.init_multiprocess()
            tsd.init_multiprocess()  # again: nothing to do
            train(xm.get_ordinal(), out_dir)
            tsd.shutdown_multiprocess()
            assert dist.is_initialized()  # the script's group stays the script's
            dist.destroy_process_group()
""")


def _start_torchruns(tmp_path, mode, node_args):
    """One torchrun per entry of ``node_args`` (its own arguments), each in its own session."""
    script = tmp_path / "train_torchrun.py"
    script.write_text(_TORCHRUN_SCRIPT)
    out_dir = tmp_path / "out"
    out_dir.mkdir(exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", SPMD_DIST_TIMEOUT="60",
               PYTHONPATH=os.pathsep.join([REPO, os.path.dirname(os.path.abspath(__file__))]))
    # Replica mode: not the SPMD mode this test process's own tests switched on (use_spmd
    # keeps it in XLA_USE_SPMD, as PyTorch/XLA does, and children inherit it).
    env.pop("XLA_USE_SPMD", None)
    procs = []
    for i, args in enumerate(node_args):
        log = open(tmp_path / f"torchrun{i}.log", "w")
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", *args, str(script), mode,
             str(out_dir)], env=env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True))
    return procs, str(out_dir)


def _wait_torchruns(tmp_path, procs, timeout):
    deadline = time.monotonic() + timeout
    try:
        codes = [p.wait(timeout=max(1.0, deadline - time.monotonic())) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()  # torchrun stops its workers (they run in sessions of their own)
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
    logs = "".join((tmp_path / f"torchrun{i}.log").read_text() for i in range(len(procs)))
    assert codes == [0] * len(procs), logs


def _check_torchrun_world(out_dir, world, local_world):
    full = _full_batch()
    got = _load(out_dir, world)
    for rank, g in enumerate(got):
        assert g["info"] == (rank, rank, rank % local_world, world, world, 1, rank,
                             rank % local_world, True, True)
        assert torch.equal(g["ranks"], torch.arange(world, dtype=torch.float32))
        assert g["rendezvous"] == [str(r).encode() for r in range(world)]
        for name, want in full.items():
            torch.testing.assert_close(g[name], want.detach(), rtol=1e-5, atol=1e-6)


# torchrun creates its rendezvous store with libuv whatever USE_LIBUV says (pytorch#148283), so
# it cannot start on a torch built without libuv (Debian's 2.6). torch_spmd's own rendezvous
# (xmp.spawn, init_multiprocess) falls back to the classic store there, and is tested above.
needs_torchrun = pytest.mark.skipif(
    not tcpstore_has_libuv(),
    reason="torchrun cannot start on a torch built without libuv (pytorch#148283)")


@needs_torchrun
def test_torchrun_workers_are_replicas_through_xmp_spawn(tmp_path):
    """``torchrun --nproc-per-node=2 script.py`` where the script calls xmp.spawn."""
    args = ["--nproc-per-node=2", "--master-addr=127.0.0.1", f"--master-port={_free_port()}"]
    procs, out_dir = _start_torchruns(tmp_path, "spawn", [args])
    _wait_torchruns(tmp_path, procs, timeout=90)
    _check_torchrun_world(out_dir, world=2, local_world=2)


@needs_torchrun
def test_two_torchruns_form_one_world(tmp_path):
    """Two torchruns (as on two machines: --nnodes=2, --node-rank 0 and 1) of 2 workers each
    make one world of 4; the script initializes torch.distributed itself."""
    port = _free_port()
    procs, out_dir = _start_torchruns(tmp_path, "init", [
        ["--nnodes=2", f"--node-rank={node}", "--nproc-per-node=2",
         "--master-addr=127.0.0.1", f"--master-port={port}"] for node in range(2)])
    _wait_torchruns(tmp_path, procs, timeout=120)
    _check_torchrun_world(out_dir, world=4, local_world=2)


@needs_torchrun
def test_torchrun_workers_join_through_the_xla_backend(tmp_path):
    """``dist.init_process_group('xla', init_method='xla://')`` under torchrun, unmodified
    PyTorch/XLA style: each worker is one replica of the world."""
    args = ["--nproc-per-node=2", "--master-addr=127.0.0.1", f"--master-port={_free_port()}"]
    procs, out_dir = _start_torchruns(tmp_path, "xla", [args])
    _wait_torchruns(tmp_path, procs, timeout=90)
    _check_torchrun_world(out_dir, world=2, local_world=2)


def test_the_xla_backend_is_refused_in_spmd_mode():
    # As PyTorch/XLA: in SPMD mode the partitioner makes the collectives.
    code = textwrap.dedent("""
        import torch.distributed as dist
        import torch_spmd.runtime as xr
        import torch_spmd.distributed.xla_backend
        xr.use_spmd()
        try:
            dist.init_process_group("xla", init_method="xla://")
        except AssertionError as e:
            assert "not supported with SPMD" in str(e), e
            assert not dist.is_initialized()
            print("refused")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=REPO), timeout=120)
    assert out.stdout.strip() == "refused", out.stderr


# ---------------------------------------------------------------------------------------------
# A single replica (no spawn): the collectives are over a group of one.

def test_single_replica_collectives_are_identities():
    dev = torch_spmd.device()
    assert (xm.get_ordinal(), xm.xrt_world_size(), xm.is_master_ordinal()) == (0, 1, True)
    x = torch.arange(6.).reshape(2, 3).to(dev)
    torch.testing.assert_close(xm.all_reduce(xm.REDUCE_SUM, x, scale=2.0).cpu(), x.cpu() * 2)
    items = [x * 1]
    xm.all_reduce(xm.REDUCE_MAX, items, scale=0.5)
    torch.testing.assert_close(items[0].cpu(), x.cpu() * 0.5)
    torch.testing.assert_close(xm.all_gather(x, dim=1).cpu(), x.cpu())
    torch.testing.assert_close(xm.reduce_scatter(xm.REDUCE_SUM, x, 1.0, 0, 1).cpu(), x.cpu())
    torch.testing.assert_close(xm.all_to_all(x, 0, 1, 1).cpu(), x.cpu())
    assert xm.rendezvous("tag", b"me") == [b"me"]
    with pytest.raises(ValueError, match="one replica"):
        xm.all_reduce(xm.REDUCE_SUM, x, groups=[[0, 1]])
    with pytest.raises(ValueError, match="shard_count=2 must equal the group size 1"):
        xm.reduce_scatter(xm.REDUCE_SUM, x, 1.0, 0, 2)
    with pytest.raises(TypeError, match="spmd device"):
        xm.all_reduce(xm.REDUCE_SUM, torch.ones(2))


def test_single_replica_collectives_are_differentiable():
    """With one replica the collectives are clones and scalings: gradients flow through."""
    dev = torch_spmd.device()
    x = torch.arange(6.).reshape(2, 3).to(dev).requires_grad_()
    y = (xm.all_reduce(xm.REDUCE_SUM, x, scale=2.0) + 3 * xm.all_gather(x, dim=1)
         + xm.reduce_scatter(xm.REDUCE_SUM, x, 0.5, 0, 1) + xm.all_to_all(x, 0, 1, 1)
         + xm.all_reduce(xm.REDUCE_MAX, x))
    y.sum().backward()
    torch.testing.assert_close(x.grad.cpu(), torch.full((2, 3), 7.5))


def test_init_multiprocess_without_a_launcher_says_what_is_missing(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(RuntimeError, match="RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT are not "
                                           "set: start the script with a launcher"):
        tsd.init_multiprocess()
    assert not tsd.is_multiprocess()
    tsd.shutdown_multiprocess()  # outside multi-process mode: nothing to do
