"""Sharded checkpoints through torch.distributed.checkpoint (DCP) with SPMDSavePlanner /
SPMDLoadPlanner: spmd -> CPU (plain DCP), CPU (plain DCP) -> spmd, spmd -> spmd resharding on
(8,), (4, 2) and (2, 2, 2) meshes with uneven shapes, optimizer state, errors that change
nothing, crash safety of save_dcp, and CheckpointManager(use_dcp=True). Values are compared
with the CPU originals exactly."""
import io
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dist_cp
import torch.nn as nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, TensorStorageMetadata

import torch_spmd
import torch_spmd.core.xla_model as xm
import torch_spmd.distributed.checkpoint as ckpt
import torch_spmd.distributed.spmd as xs
from torch_spmd.distributed.checkpoint import (SPMDLoadPlanner, SPMDSavePlanner, load_dcp,
                                               save_dcp)
from torch_spmd.distributed.checkpoint import _dcp

N = 8
DEV = torch_spmd.device()
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = [pytest.mark.usefixtures("eight_devices"),
              # DCP says it runs in one process: that is the point here.
              pytest.mark.filterwarnings("ignore:torch.distributed is disabled"),
              pytest.mark.filterwarnings("ignore:Detected an existing checkpoint")]

MESHES = {
    "8": ((8,), ("x",)),
    "4x2": ((4, 2), ("a", "b")),
    "2x2x2": ((2, 2, 2), ("x", "y", "z")),
}


def mesh(name, ids=None):
    shape, names = MESHES[name]
    return xs.Mesh(np.arange(N) if ids is None else np.asarray(ids), shape, names)


def sharded(host, mesh_name, partition_spec, ids=None):
    t = host.to(DEV)
    xs.mark_sharding(t, mesh(mesh_name, ids), partition_spec)
    return t


def spec(t):
    return xs.get_sharding_spec(t) or "{replicated}"


def host_tensor(shape, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(dtype)


def spmd_save(state_dict, path):
    dist_cp.save(state_dict, storage_writer=dist_cp.FileSystemWriter(str(path)),
                 planner=SPMDSavePlanner())


def spmd_load(state_dict, path, **kwargs):
    dist_cp.load(state_dict, storage_reader=dist_cp.FileSystemReader(str(path)),
                 planner=SPMDLoadPlanner(**kwargs))


def metadata(path):
    return dist_cp.FileSystemReader(str(path)).read_metadata().state_dict_metadata


def distinct_tiles(t):
    """(offsets, sizes) of every distinct non-empty tile, from XLAShardedTensor.local_shards."""
    wrapper = t if isinstance(t, xs.XLAShardedTensor) else xs.XLAShardedTensor(t)
    tiles = set()
    for shard in wrapper.local_shards:
        if shard.indices is Ellipsis:
            return {(tuple(0 for _ in t.shape), tuple(t.shape))}
        box = (tuple(s.start for s in shard.indices),
               tuple(s.stop - s.start for s in shard.indices))
        if all(n > 0 for n in box[1]):
            tiles.add(box)
    return tiles


# Layouts: (mesh, shape, partition spec). Uneven dims: 10 rows over 4 or 8 tiles (3,3,3,1 and
# 2,2,2,2,2,0,0,0), 6 columns over 8 (1 each, two empty), 7x5 over 4x2.
LAYOUTS = [
    ("8", (16, 4), ("x", None)),
    ("8", (10, 6), ("x", None)),
    ("8", (10, 6), (None, "x")),
    ("4x2", (10, 6), ("a", None)),          # the 10x6 tensor on 4 devices (replicated over b)
    ("4x2", (10, 6), ("a", "b")),
    ("4x2", (10, 6), ("b", "a")),
    ("4x2", (10, 6), (None, ("a", "b"))),
    ("4x2", (13,), ("a",)),
    ("2x2x2", (10, 6), (("x", "y"), None)),  # 10 rows over 4
    ("2x2x2", (7, 5, 3), ("z", ("x", "y"), None)),
    ("2x2x2", (8, 6), (None, "y")),          # partially replicated: 2 tiles
]


def layout_id(layout):
    return f"{layout[0]}-{'x'.join(map(str, layout[1]))}-{layout[2]}"


# ---------------------------------------------------------------------------------------------
# spmd -> CPU (plain DCP)


@pytest.mark.parametrize("layout", LAYOUTS, ids=layout_id)
def test_spmd_save_loads_into_cpu_with_plain_dcp(tmp_path, layout):
    mesh_name, shape, partition_spec = layout
    host = host_tensor(shape)
    t = sharded(host, mesh_name, partition_spec)
    spmd_save({"w": t, "step": 3}, tmp_path)

    md = metadata(tmp_path)["w"]
    assert isinstance(md, TensorStorageMetadata)
    assert tuple(md.size) == shape and md.properties.dtype == torch.float32
    chunks = [(tuple(c.offsets), tuple(c.sizes)) for c in md.chunks]
    assert len(chunks) == len(set(chunks))           # replicas of a tile saved once
    assert set(chunks) == distinct_tiles(t)          # one chunk per distinct non-empty tile
    assert isinstance(metadata(tmp_path)["step"], BytesStorageMetadata)

    out = {"w": torch.zeros(shape), "step": 0}
    dist_cp.load(out, checkpoint_id=str(tmp_path))   # the default planner, nothing of ours
    assert torch.equal(out["w"], host) and out["step"] == 3


def test_saved_chunks_are_the_unpadded_local_shards(tmp_path):
    """What is on disk for each chunk is the unpadded tile itself (10 rows over 4: 3,3,3,1)."""
    host = host_tensor((10, 6))
    t = sharded(host, "4x2", ("a", "b"))
    spmd_save({"w": t}, tmp_path)
    md = dist_cp.FileSystemReader(str(tmp_path)).read_metadata()
    chunks = md.state_dict_metadata["w"].chunks
    assert sorted(tuple(c.sizes) for c in chunks) == [(1, 3), (1, 3)] + [(3, 3)] * 6
    for index, info in md.storage_data.items():
        assert index.fqn == "w"
        raw = (tmp_path / info.relative_path).read_bytes()[info.offset:info.offset + info.length]
        data = torch.load(io.BytesIO(raw), weights_only=True)
        region = tuple(slice(o, o + n) for o, n in zip(index.offset, data.shape))
        assert torch.equal(data, host[region])
        assert any(tuple(c.offsets) == tuple(index.offset) and tuple(c.sizes) == data.shape
                   for c in chunks)


# ---------------------------------------------------------------------------------------------
# CPU (plain DCP) -> spmd


@pytest.mark.parametrize("layout", LAYOUTS, ids=layout_id)
def test_plain_dcp_checkpoint_loads_into_sharded_tensors(tmp_path, layout):
    mesh_name, shape, partition_spec = layout
    host = host_tensor(shape, seed=1)
    dist_cp.save({"w": host, "name": "cpu run"}, checkpoint_id=str(tmp_path))  # plain DCP
    target = sharded(torch.zeros(shape), mesh_name, partition_spec)
    before = spec(target)
    state = {"w": target, "name": None}
    spmd_load(state, tmp_path)
    assert spec(target) == before                    # the target keeps its layout
    assert torch.equal(target.cpu(), host)
    assert state["name"] == "cpu run"
    # Every device's shard holds its own slice of the CPU original (padding aside).
    for shard in xs.XLAShardedTensor(target).local_shards:
        if shard.indices is not Ellipsis:
            assert torch.equal(shard.unpadded_data, host[tuple(shard.indices)])


def test_plain_dcp_chunked_checkpoint_loads_into_sharded_tensors(tmp_path):
    """A checkpoint whose chunks match nothing of the target layout (saved from 3 row blocks)
    loads by assembling each tile from the chunks it overlaps."""
    host = host_tensor((10, 6), seed=2)
    pieces = [(0, 4), (4, 3), (7, 3)]

    class Blocks(SPMDSavePlanner):
        def set_up_planner(self, state_dict, storage_meta=None, is_coordinator=False):
            from torch_spmd.distributed.checkpoint import HostShards
            super().set_up_planner({"w": HostShards((10, 6), torch.float32, [
                (((o, 0), (n, 6)), host[o:o + n].clone()) for o, n in pieces])},
                storage_meta, is_coordinator)

    dist_cp.save({"w": host}, storage_writer=dist_cp.FileSystemWriter(str(tmp_path)),
                 planner=Blocks())
    assert len(metadata(tmp_path)["w"].chunks) == 3
    for mesh_name, partition_spec in [("4x2", ("a", "b")), ("2x2x2", (None, ("z", "x"))),
                                      ("8", ("x", None))]:
        target = sharded(torch.zeros(10, 6), mesh_name, partition_spec)
        spmd_load({"w": target}, tmp_path)
        assert torch.equal(target.cpu(), host), (mesh_name, partition_spec)


# ---------------------------------------------------------------------------------------------
# spmd -> spmd


@pytest.mark.parametrize("source, dest", [
    (("4x2", ("a", "b")), ("2x2x2", (("z", "x"), "y"))),
    (("4x2", ("a", "b")), ("8", (None, "x"))),
    (("8", ("x", None)), ("4x2", ("b", "a"))),
    (("2x2x2", (("x", "y"), "z")), ("4x2", (None, None))),    # replicated target
    (("2x2x2", (None, "y")), ("8", ("x", None))),             # from partial replication
], ids=lambda x: f"{x[0]}{x[1]}")
def test_spmd_to_spmd_reshard(tmp_path, source, dest):
    host = host_tensor((10, 6), seed=3)
    spmd_save({"w": sharded(host, *source)}, tmp_path)
    target = sharded(torch.zeros(10, 6), *dest)
    before = spec(target)
    spmd_load({"w": target}, tmp_path)
    assert spec(target) == before
    assert torch.equal(target.cpu(), host)


def test_spmd_to_spmd_permuted_devices_and_dtype(tmp_path):
    host = host_tensor((12, 9), seed=4)
    spmd_save({"w": sharded(host, "4x2", ("a", "b"))}, tmp_path)
    target = sharded(torch.zeros(12, 9, dtype=torch.float64), "2x2x2", ("y", ("z", "x")),
                     ids=[3, 1, 7, 5, 0, 2, 4, 6])
    spmd_load({"w": target}, tmp_path)
    assert target.dtype == torch.float64             # the target keeps its dtype
    assert torch.equal(target.cpu(), host.double())


@pytest.mark.parametrize("dest", [None, ("8", (None, "x")), ("4x2", ("b", "a"))],
                         ids=["unsharded", "8-cols", "4x2-ba"])
def test_dcp_default_planner_loads_every_chunk_into_spmd_tensors(tmp_path, dest):
    """dist_cp.load without a planner: DCP's DefaultLoadPlanner writes each saved chunk into a
    narrowed view of the target (a sharded checkpoint into an unsharded model: PyTorch/XLA's
    test_resharding_sharded_to_unsharded). Every chunk lands, through the model's
    state_dict into its parameters."""
    host_w, host_b = host_tensor((10, 6), seed=5), host_tensor((10,), seed=6)
    spmd_save({"w": sharded(host_w, "4x2", ("a", "b")), "b": sharded(host_b, "8", ("x",))},
              tmp_path)
    model = nn.Linear(6, 10).to(DEV)
    if dest is not None:
        xs.mark_sharding(model.weight, mesh(dest[0]), dest[1])
    state = model.state_dict()
    dist_cp.load({"w": state["weight"], "b": state["bias"]},
                 storage_reader=dist_cp.FileSystemReader(str(tmp_path)))
    assert torch.equal(model.weight.cpu(), host_w)
    assert torch.equal(model.bias.cpu(), host_b)


def test_unsharded_values_and_objects(tmp_path):
    m = mesh("4x2")
    state = {
        "replicated": sharded(host_tensor((5, 3), 5), "4x2", (None, None)),
        "plain": host_tensor((4,), 6).to(DEV),
        "cpu": host_tensor((3, 3), 7),
        "scalar": sharded(torch.tensor(2.5), "4x2", ()),
        "ints": torch.arange(12).reshape(3, 4).to(DEV),
        "wrapper": xs.mark_sharding(host_tensor((8, 2), 8).to(DEV), m, ("a", None)),
        "nested": {"list": [host_tensor((2,), 9).to(DEV), 7], "tuple": (1, "two")},
        "state": {0: {"count": 4, "t": host_tensor((6,), 10).to(DEV)}},
        "step": 12,
        "name": "run-1",
    }
    ref = {
        "replicated": host_tensor((5, 3), 5), "plain": host_tensor((4,), 6),
        "cpu": host_tensor((3, 3), 7), "scalar": torch.tensor(2.5),
        "ints": torch.arange(12).reshape(3, 4), "wrapper": host_tensor((8, 2), 8),
        "list0": host_tensor((2,), 9), "state_t": host_tensor((6,), 10),
    }
    spmd_save(state, tmp_path)
    md = metadata(tmp_path)
    assert len(md["replicated"].chunks) == 1 and len(md["plain"].chunks) == 1
    assert isinstance(md["nested.tuple"], BytesStorageMetadata)

    target = {
        "replicated": sharded(torch.zeros(5, 3), "4x2", (None, "a")),
        "plain": torch.zeros(4).to(DEV),
        "cpu": torch.zeros(3, 3),
        "scalar": torch.tensor(0.).to(DEV),
        "ints": sharded(torch.zeros(3, 4, dtype=torch.long), "4x2", ("b", "a")),
        "wrapper": xs.mark_sharding(torch.zeros(8, 2).to(DEV), m, ("b", None)),
        "nested": {"list": [torch.zeros(2).to(DEV), 0], "tuple": None},
        "state": {0: {"count": 0, "t": torch.zeros(6)}},
        "step": 0,
        "name": None,
    }
    spmd_load(target, tmp_path)
    for k in ("replicated", "plain", "cpu", "scalar", "ints"):
        assert torch.equal(target[k].cpu(), ref[k]), k
    assert isinstance(target["wrapper"], xs.XLAShardedTensor)
    assert torch.equal(target["wrapper"].global_tensor.cpu(), ref["wrapper"])
    assert torch.equal(target["nested"]["list"][0].cpu(), ref["list0"])
    assert target["nested"]["list"][1] == 7 and target["nested"]["tuple"] == (1, "two")
    # DCP names dict keys by str(key); the int key 0 stays an int key.
    assert list(target["state"]) == [0] and target["state"][0]["count"] == 4
    assert torch.equal(target["state"][0]["t"], ref["state_t"])
    assert target["step"] == 12 and target["name"] == "run-1"
    assert target["cpu"].device.type == "cpu" and target["plain"].device == DEV

    # The same checkpoint, read by plain DCP into CPU tensors.
    cpu = {k: torch.zeros_like(v) for k, v in ref.items() if k not in ("list0", "state_t")}
    cpu["wrapper"] = torch.zeros(8, 2)
    dist_cp.load(cpu, checkpoint_id=str(tmp_path))
    for k, v in cpu.items():
        assert torch.equal(v, ref[k]), k


def test_staged_host_copy_saves_the_same_checkpoint(tmp_path):
    host = host_tensor((10, 6), seed=11)
    t = sharded(host, "2x2x2", (("x", "y"), "z"))
    staged = ckpt.stage_state_dict({"w": t, "opt": {0: {"m": t * 2}}, "n": 1})
    with torch.no_grad():
        t.add_(1)  # after staging: not in the checkpoint
    xm.mark_step()
    spmd_save(staged, tmp_path / "staged")
    spmd_save({"w": sharded(host, "2x2x2", (("x", "y"), "z")),
               "opt": {0: {"m": (host * 2).to(DEV)}}, "n": 1}, tmp_path / "direct")
    staged_md, direct_md = metadata(tmp_path / "staged"), metadata(tmp_path / "direct")
    assert sorted(staged_md) == sorted(direct_md) == ["n", "opt.0.m", "w"]
    assert staged_md["w"].chunks == direct_md["w"].chunks
    out = {"w": torch.zeros(10, 6), "opt": {0: {"m": torch.zeros(10, 6)}}, "n": 0}
    dist_cp.load(out, checkpoint_id=str(tmp_path / "staged"))
    assert torch.equal(out["w"], host) and torch.equal(out["opt"][0]["m"], host * 2)


# ---------------------------------------------------------------------------------------------
# Models and optimizer state


def make_model(device=DEV, mesh_name=None, partition_specs=()):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 12), nn.ReLU(), nn.Linear(12, 6)).to(device)
    for p, s in zip(model.parameters(), partition_specs):
        if s is not None:
            xs.mark_sharding(p, mesh(mesh_name), s)
    return model


def train(model, opt, device, steps=2):
    g = torch.Generator().manual_seed(42)
    for _ in range(steps):
        x = torch.randn(8, 10, generator=g).to(device)
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
        if device == DEV:
            xm.mark_step()


def prime_cpu(opt):
    for group in opt.param_groups:
        for p in group["params"]:
            p.grad = torch.zeros_like(p)
    opt.step()
    opt.zero_grad(set_to_none=True)


def host_state(model, opt):
    params = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    state = {i: {k: v.detach().cpu().clone() for k, v in s.items()}
             for i, s in opt.state_dict()["state"].items()}
    return params, state


def assert_same_state(model, opt, ref_params, ref_state, lr):
    for k, v in model.state_dict().items():
        assert torch.equal(v.cpu(), ref_params[k]), k
    got = opt.state_dict()["state"]
    assert sorted(got) == sorted(ref_state)
    for i, s in got.items():
        for k, v in s.items():
            assert torch.equal(v.cpu(), ref_state[i][k]), (i, k)
    assert opt.param_groups[0]["lr"] == lr


SPECS_4X2 = [("a", "b"), ("a",), (None, "a"), None]       # 12x10, 12, 6x12, 6
SPECS_2X2X2 = [(None, ("x", "z")), None, (("y", "z"), "x"), ("y",)]


def test_adam_spmd_to_cpu_and_spmd(tmp_path):
    model = make_model(DEV, "4x2", SPECS_4X2)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    train(model, opt, DEV)
    ref_params, ref_state = host_state(model, opt)
    spmd_save({"model": model.state_dict(), "optim": opt.state_dict()}, tmp_path)
    assert len(metadata(tmp_path)["optim.state.0.exp_avg"].chunks) == 8

    # Into a plain CPU model and Adam, with DCP alone.
    cpu_model = make_model("cpu")
    cpu_opt = torch.optim.Adam(cpu_model.parameters(), lr=0.5)
    prime_cpu(cpu_opt)
    cpu_sd = {"model": cpu_model.state_dict(), "optim": cpu_opt.state_dict()}
    dist_cp.load(cpu_sd, checkpoint_id=str(tmp_path))
    cpu_model.load_state_dict(cpu_sd["model"])
    cpu_opt.load_state_dict(cpu_sd["optim"])
    assert_same_state(cpu_model, cpu_opt, ref_params, ref_state, lr=0.1)

    # Into an spmd model on another mesh with other specs.
    model2 = make_model(DEV, "2x2x2", SPECS_2X2X2)
    opt2 = torch.optim.Adam(model2.parameters(), lr=0.5)
    ckpt.prime_optimizer(opt2)
    specs = {n: spec(p) for n, p in model2.named_parameters()}
    sd = {"model": model2.state_dict(), "optim": opt2.state_dict()}
    spmd_load(sd, tmp_path)
    model2.load_state_dict(sd["model"])
    opt2.load_state_dict(sd["optim"])
    xm.mark_step()
    assert_same_state(model2, opt2, ref_params, ref_state, lr=0.1)
    assert {n: spec(p) for n, p in model2.named_parameters()} == specs


def test_adam_cpu_to_spmd(tmp_path):
    cpu_model = make_model("cpu")
    cpu_opt = torch.optim.Adam(cpu_model.parameters(), lr=0.05)
    train(cpu_model, cpu_opt, "cpu", steps=3)
    ref_params, ref_state = host_state(cpu_model, cpu_opt)
    dist_cp.save({"model": cpu_model.state_dict(), "optim": cpu_opt.state_dict()},
                 checkpoint_id=str(tmp_path))               # plain DCP, plain CPU model

    model = make_model(DEV, "8", [("x", None), ("x",), (None, "x"), None])
    opt = torch.optim.Adam(model.parameters(), lr=0.5)
    ckpt.prime_optimizer(opt)
    sd = {"model": model.state_dict(), "optim": opt.state_dict()}
    spmd_load(sd, tmp_path)
    model.load_state_dict(sd["model"])
    opt.load_state_dict(sd["optim"])
    xm.mark_step()
    assert_same_state(model, opt, ref_params, ref_state, lr=0.05)
    assert spec(model[0].weight) == "{devices=[8,1]0,1,2,3,4,5,6,7}"


# ---------------------------------------------------------------------------------------------
# Errors: clear messages, and nothing changes


def snapshot(state):
    return {k: (v.detach().cpu().clone() if isinstance(v, torch.Tensor) else v)
            for k, v in state.items()}


def assert_unchanged(state, before):
    for k, v in state.items():
        if isinstance(v, torch.Tensor):
            assert torch.equal(v.detach().cpu(), before[k]), k
        else:
            assert v == before[k], k


def expect_failure(exc_type, match, state, path, **kwargs):
    """Through dist_cp the planner's error arrives inside DCP's CheckpointException; load_dcp
    raises it as is. Either way no target changes."""
    before = snapshot(state)
    with pytest.raises(CheckpointException) as info:
        spmd_load(state, path, **kwargs)
    (original, _trace), = info.value.failures.values()
    assert isinstance(original, exc_type), original
    assert match in str(original), str(original)
    assert_unchanged(state, before)
    with pytest.raises(exc_type, match=re.escape(match)):
        load_dcp(state, str(path), **kwargs)
    assert_unchanged(state, before)


@pytest.fixture
def saved(tmp_path):
    save_dcp({"a": sharded(host_tensor((10, 6), 20), "4x2", ("a", "b")),
              "b": host_tensor((3,), 21), "n": 5}, str(tmp_path / "ck"))
    return tmp_path / "ck"


def fresh_targets():
    return {"a": sharded(torch.full((10, 6), -1.), "2x2x2", ("x", ("y", "z"))),
            "b": torch.full((3,), -1.), "n": -1}


def test_shape_mismatch(saved):
    state = fresh_targets()
    state["b"] = torch.full((4,), -1.)
    expect_failure(ValueError, "checkpoint entry 'b' has shape [3], the target [4]", state, saved)
    state = fresh_targets()
    state["a"] = sharded(torch.full((6, 10), -1.), "4x2", ("a", "b"))
    expect_failure(ValueError, "checkpoint entry 'a' has shape [10, 6], the target [6, 10]",
                   state, saved)


def test_missing_key_and_partial_load(saved):
    state = fresh_targets()
    state["extra"] = torch.zeros(2)
    expect_failure(RuntimeError, "Missing key in checkpoint state_dict: extra.", state, saved)
    load_dcp(state, str(saved), allow_partial_load=True)
    assert torch.equal(state["a"].cpu(), host_tensor((10, 6), 20)) and state["n"] == 5
    assert torch.equal(state["extra"], torch.zeros(2))


def test_kind_mismatch(saved):
    state = fresh_targets()
    state["n"] = torch.zeros(1)
    expect_failure(ValueError, "checkpoint entry 'n' is not a tensor", state, saved)
    state = fresh_targets()
    state["b"] = "not a tensor"
    expect_failure(ValueError, "checkpoint entry 'b' is a tensor of shape [3], the target is a "
                   "str", state, saved)


def test_damaged_checkpoint_is_detected(saved):
    import pickle
    meta_path = saved / ".metadata"
    md = pickle.loads(meta_path.read_bytes())
    md.state_dict_metadata["a"].chunks.pop()  # a tile's chunk lost
    meta_path.write_bytes(pickle.dumps(md))
    expect_failure(RuntimeError, "checkpoint entry 'a': the saved chunks cover", fresh_targets(),
                   saved)


def test_read_error_midway_changes_nothing(saved):
    """The data file is cut short: the first chunks read fine, a later one fails. No target
    (sharded, CPU, object) may hold a mix of old and new values."""
    (data_file,) = [f for f in os.listdir(saved) if f.endswith(".distcp")]
    path = saved / data_file
    path.write_bytes(path.read_bytes()[:path.stat().st_size * 2 // 3])
    state = fresh_targets()
    before = snapshot(state)
    with pytest.raises(Exception):
        load_dcp(state, str(saved))
    assert_unchanged(state, before)


def test_load_and_save_path_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no DCP checkpoint"):
        load_dcp({"a": torch.zeros(1)}, str(tmp_path / "nowhere"))
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="non-empty directory that holds no checkpoint"):
        save_dcp({"a": torch.zeros(1)}, str(other))
    assert os.listdir(other) == ["notes.txt"]


# ---------------------------------------------------------------------------------------------
# Crash safety of save_dcp


def saved_value(path):
    out = {"t": torch.zeros(16, 4)}
    dist_cp.load(out, checkpoint_id=str(path))
    return out["t"]


def state_of(v):
    return {"t": sharded(torch.full((16, 4), float(v)), "8", ("x", None))}


def test_interrupted_save_keeps_previous(tmp_path, monkeypatch):
    path = tmp_path / "ck"
    save_dcp(state_of(1), str(path))
    calls = []
    real = SPMDSavePlanner.resolve_data

    def crash_midway(self, item):
        calls.append(item)
        if len(calls) == 3:
            raise KeyboardInterrupt("simulated crash while writing")
        return real(self, item)

    monkeypatch.setattr(SPMDSavePlanner, "resolve_data", crash_midway)
    with pytest.raises(BaseException, match="simulated crash"):
        save_dcp(state_of(2), str(path))
    monkeypatch.undo()
    assert len(calls) == 3
    assert torch.equal(saved_value(path), torch.ones(16, 4))
    assert os.listdir(tmp_path) == ["ck"]  # the half-written directory is gone
    save_dcp(state_of(3), str(path))
    assert torch.equal(saved_value(path), torch.full((16, 4), 3.))


def test_crash_between_renames_is_recovered(tmp_path, monkeypatch):
    path = tmp_path / "ck"
    save_dcp(state_of(1), str(path))
    real_rename = os.rename

    def rename(src, dst):
        if os.path.basename(str(src)).startswith(".ck.dcp-"):  # moving the new one in
            raise KeyboardInterrupt("simulated crash between the renames")
        real_rename(src, dst)

    monkeypatch.setattr(_dcp.os, "rename", rename)
    with pytest.raises(KeyboardInterrupt):
        save_dcp(state_of(2), str(path))
    monkeypatch.undo()
    # The previous checkpoint was moved aside, the new one not moved in.
    assert not path.exists() and len(_dcp._siblings(str(path), _dcp._OLD_TAG)) == 1
    out = {"t": torch.zeros(16, 4)}
    load_dcp(out, str(path))  # puts the previous checkpoint back, then loads it
    assert torch.equal(out["t"], torch.ones(16, 4))
    assert os.listdir(tmp_path) == ["ck"]


def test_killed_process_keeps_previous(tmp_path):
    """A hard kill (no handlers run) while the new checkpoint is being written."""
    path = str(tmp_path / "ck")
    script = textwrap.dedent(f"""
        import os, sys, warnings
        warnings.simplefilter("ignore")
        os.environ["SPMD_NUM_DEVICES"] = "8"
        sys.path.insert(0, {ROOT!r})
        import numpy as np, torch, torch_spmd
        import torch_spmd.distributed.spmd as xs
        from torch_spmd.distributed.checkpoint import save_dcp, SPMDSavePlanner
        mesh = xs.Mesh(np.arange(8), (8,), ("x",))
        def state(v):
            t = torch.full((16, 4), float(v)).to(torch_spmd.device())
            xs.mark_sharding(t, mesh, ("x", None))
            return {{"t": t}}
        save_dcp(state(1), {path!r})
        real, calls = SPMDSavePlanner.resolve_data, []
        def die(self, item):
            calls.append(item)
            if len(calls) == 4:
                os._exit(9)
            return real(self, item)
        SPMDSavePlanner.resolve_data = die
        save_dcp(state(2), {path!r})
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 9, proc.stderr
    leftovers = _dcp._siblings(path, _dcp._NEW_TAG)
    assert len(leftovers) == 1  # the half-written new checkpoint
    assert torch.equal(saved_value(path), torch.ones(16, 4))
    save_dcp(state_of(5), path)
    assert not _dcp._siblings(path, _dcp._NEW_TAG)
    assert torch.equal(saved_value(path), torch.full((16, 4), 5.))


# ---------------------------------------------------------------------------------------------
# CheckpointManager(use_dcp=True)


def test_manager_dcp_save_keep_restore(tmp_path):
    path = str(tmp_path / "run")
    mgr = ckpt.CheckpointManager(path, save_interval=2, max_to_keep=2, use_dcp=True)
    for step in range(7):
        t = sharded(torch.full((10, 6), float(step)), "4x2", ("a", "b"))
        assert mgr.save(step, {"t": t, "step": step}) == (step % 2 == 0)
    assert mgr.all_steps() == [4, 6] and sorted(os.listdir(path)) == ["4", "6"]
    # Each step is a standard DCP checkpoint.
    out = {"t": torch.zeros(10, 6), "step": -1}
    dist_cp.load(out, checkpoint_id=os.path.join(path, "6"))
    assert torch.equal(out["t"], torch.full((10, 6), 6.)) and out["step"] == 6
    target = {"t": sharded(torch.zeros(10, 6), "2x2x2", (None, ("x", "y"))), "step": -1}
    mgr.restore(4, target)
    assert torch.equal(target["t"].cpu(), torch.full((10, 6), 4.)) and target["step"] == 4
    # Saving a tracked step again replaces it whole.
    assert mgr.save(6, {"t": torch.full((10, 6), 60.), "step": 60}, force=True)
    mgr.restore(6, target)
    assert torch.equal(target["t"].cpu(), torch.full((10, 6), 60.)) and target["step"] == 60
    assert sorted(os.listdir(path)) == ["4", "6"]
    assert ckpt.CheckpointManager(path, save_interval=2).all_steps() == [4, 6]


def test_manager_dcp_async_and_mixed_formats(tmp_path):
    path = str(tmp_path)
    t = sharded(torch.ones(8, 4), "8", ("x", None))
    old = ckpt.CheckpointManager(path, save_interval=1)           # torch_spmd format
    assert old.save(1, {"t": t})
    mgr = ckpt.CheckpointManager(path, save_interval=1, use_dcp=True)
    assert mgr.save_async(2, {"t": t})
    with torch.no_grad():
        t.mul_(3)  # after the host copy: not in step 2
    xm.mark_step()
    assert mgr.save_async(3, {"t": t})
    mgr.join()
    assert mgr.all_steps() == [1, 2, 3]
    assert not _dcp.is_dcp_checkpoint(os.path.join(path, "1"))
    assert _dcp.is_dcp_checkpoint(os.path.join(path, "2"))
    for step, value in [(1, 1.), (2, 1.), (3, 3.)]:
        out = {"t": sharded(torch.zeros(8, 4), "4x2", ("b", "a"))}
        mgr.restore(step, out)
        assert torch.equal(out["t"].cpu(), torch.full((8, 4), value)), step
    # The torch_spmd-format manager replaces a DCP step whole, too.
    assert old.save(2, {"t": torch.full((8, 4), 7.)}, force=True)
    assert not _dcp.is_dcp_checkpoint(os.path.join(path, "2"))
    out = {"t": torch.zeros(8, 4)}
    old.restore(2, out)
    assert torch.equal(out["t"], torch.full((8, 4), 7.))


def test_manager_dcp_interrupted_save_keeps_previous(tmp_path, monkeypatch):
    path = str(tmp_path)
    mgr = ckpt.CheckpointManager(path, save_interval=1, use_dcp=True)
    mgr.save(1, {"t": torch.ones(4)})
    real = SPMDSavePlanner.resolve_data

    def crash(self, item):
        raise RuntimeError("disk full")

    monkeypatch.setattr(SPMDSavePlanner, "resolve_data", crash)
    with pytest.raises(RuntimeError, match="disk full"):
        mgr.save(1, {"t": torch.full((4,), 2.)}, force=True)   # replacing step 1
    with pytest.raises(RuntimeError, match="disk full"):
        mgr.save(2, {"t": torch.full((4,), 2.)})               # a new step
    monkeypatch.setattr(SPMDSavePlanner, "resolve_data", real)
    assert mgr.all_steps() == [1] and os.listdir(path) == ["1"]
    out = {"t": torch.zeros(4)}
    mgr.restore(1, out)
    assert torch.equal(out["t"], torch.ones(4))
    # A crash between the renames of a replacement: a new manager puts step 1 back.
    os.rename(os.path.join(path, "1"), os.path.join(path, ".1.old-0123abcd"))
    assert ckpt.CheckpointManager(path, save_interval=1, use_dcp=True).all_steps() == [1]
    assert os.listdir(path) == ["1"]


def test_experimental_alias():
    import torch_spmd.experimental.distributed_checkpoint as xc
    assert xc.SPMDSavePlanner is SPMDSavePlanner and xc.SPMDLoadPlanner is SPMDLoadPlanner
    assert xc.save_dcp is save_dcp and xc.load_dcp is load_dcp
    assert xc.CheckpointManager is ckpt.CheckpointManager
