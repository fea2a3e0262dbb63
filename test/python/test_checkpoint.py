"""Sharded checkpoints (torch_spmd.distributed.checkpoint): shard geometry, round trips under the
same and other meshes/specs, uneven shapes, optimizer state, crash safety of saves, exact
resumption of training, and CheckpointManager."""
import functools
import json
import gc
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
import torch.nn as nn

import torch_spmd
import torch_spmd.core.xla_model as xm
import torch_spmd.distributed.checkpoint as ckpt
import torch_spmd.distributed.spmd as xs
import torch_spmd.runtime as xr
from torch_spmd import _C
from torch_spmd.distributed.checkpoint import _layout, _storage
from torch_spmd.distributed.wrap import transformer_auto_wrap_policy
from torch_spmd.experimental import FSDPv2

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
import tiny_gpt  # noqa: E402

N = 8
DEV = torch_spmd.device()
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


pytestmark = pytest.mark.usefixtures("eight_devices")



def mesh(shape, names=("fsdp", "tensor"), ids=None):
    ids = np.arange(N) if ids is None else np.asarray(ids)
    return xs.Mesh(ids, shape, names[:len(shape)])


def sharded(host, m, partition_spec):
    t = host.to(DEV)
    xs.mark_sharding(t, m, partition_spec)
    return t


def spec(t):
    """The sharding string; no sharding ("") and "{replicated}" are the same layout."""
    return xs.get_sharding_spec(t) or "{replicated}"


# ---------------------------------------------------------------------------------------------
# Geometry


@pytest.mark.parametrize("shape, mesh_args, partition_spec", [
    ((16, 8), ((4, 2),), ("fsdp", "tensor")),
    ((13, 5), ((4, 2),), ("tensor", "fsdp")),          # transposed, uneven
    ((10,), ((8,), ("fsdp",)), ("fsdp",)),              # empty shards
    ((6, 4), ((4, 2),), ("tensor", None)),              # partially replicated
    ((7, 3, 5), ((2, 4),), (None, ("fsdp", "tensor"), None)),
    ((9, 9), ((4, 2), ("fsdp", "tensor"), [7, 6, 5, 4, 3, 2, 1, 0]), (None, "fsdp")),
])
def test_device_shards_match_local_shards(shape, mesh_args, partition_spec):
    t = sharded(torch.arange(float(np.prod(shape))).reshape(shape), mesh(*mesh_args),
                partition_spec)
    computed = _layout.device_shards(spec(t), shape)
    for got, (device, data, offsets, lengths, _) in zip(computed, _C._local_shards(t)):
        assert got.device == device
        assert got.box == (tuple(offsets), tuple(lengths))
        assert got.padded_shape == tuple(data.shape)


# ---------------------------------------------------------------------------------------------
# Round trips and resharding


def reload(saved, target, tmp_path):
    ckpt.save_sharded({"t": saved}, str(tmp_path))
    before = spec(target)
    ckpt.load_sharded({"t": target}, str(tmp_path))
    assert spec(target) == before  # the target keeps its own layout
    return target


def test_round_trip_same_mesh(tmp_path):
    host = torch.randn(16, 8)
    m = mesh((4, 2))
    target = sharded(torch.zeros(16, 8), m, ("fsdp", "tensor"))
    reload(sharded(host, m, ("fsdp", "tensor")), target, tmp_path)
    assert torch.equal(target.cpu(), host)
    meta = ckpt.read_metadata(str(tmp_path))["t"]
    assert meta["shape"] == [16, 8] and meta["dtype"] == "torch.float32"
    assert meta["mesh"] == {"device_ids": list(range(8)), "mesh_shape": [4, 2],
                            "axis_names": ["fsdp", "tensor"]}
    assert meta["partition_spec"] == ["fsdp", "tensor"]
    assert meta["sharding"] == m.get_op_sharding(("fsdp", "tensor"))
    assert len(meta["pieces"]) == 8  # one per device, each 4x4
    assert all(p["lengths"] == [4, 4] for p in meta["pieces"])


def test_a_checkpoint_of_another_format_version_says_why_it_does_not_load(tmp_path):
    ckpt.save_sharded({"t": sharded(torch.randn(16, 8), mesh((4, 2)), ("fsdp", "tensor"))},
                      str(tmp_path))
    manifest = tmp_path / _storage.MANIFEST
    data = json.loads(manifest.read_text())
    data["version"] = 99
    manifest.write_text(json.dumps(data))
    target = sharded(torch.zeros(16, 8), mesh((8,)), ("fsdp", None))
    with pytest.raises(ValueError, match=r"unsupported checkpoint version 99 \(this torch_spmd "
                                         r"reads version 1; a DCP checkpoint"):
        ckpt.load_sharded({"t": target}, str(tmp_path))
    assert torch.equal(target.cpu(), torch.zeros(16, 8))  # untouched


def test_reshard_4x2_to_8x1(tmp_path):
    host = torch.randn(24, 10)
    target = sharded(torch.zeros(24, 10), mesh((8, 1)), ("fsdp", None))
    reload(sharded(host, mesh((4, 2)), ("fsdp", "tensor")), target, tmp_path)
    assert torch.equal(target.cpu(), host)
    assert spec(target) == "{devices=[8,1]0,1,2,3,4,5,6,7}"


def test_reshard_transposed_spec_and_device_order(tmp_path):
    host = torch.randn(12, 20)
    saved = sharded(host, mesh((4, 2)), ("fsdp", "tensor"))
    m2 = mesh((2, 4), ids=[3, 1, 7, 5, 0, 2, 4, 6])
    target = sharded(torch.zeros(12, 20), m2, ("tensor", "fsdp"))
    reload(saved, target, tmp_path)
    assert torch.equal(target.cpu(), host)


def test_uneven_shapes(tmp_path):
    host = torch.randn(13, 7)
    saved = sharded(host, mesh((8,), ("fsdp",)), ("fsdp", None))  # rows 2,2,2,2,2,2,1,0
    target = sharded(torch.zeros(13, 7), mesh((4, 2)), ("tensor", "fsdp"))  # 7 cols over 4
    reload(saved, target, tmp_path)
    assert torch.equal(target.cpu(), host)
    meta_pieces = ckpt.read_metadata(str(tmp_path))["t"]["pieces"]
    # ceil(13/8)=2 rows per shard: 6 full shards, one of 1 row, one empty (not saved)
    assert sorted(p["lengths"][0] for p in meta_pieces) == [1, 2, 2, 2, 2, 2, 2]
    for target_spec in [(("fsdp", "tensor"), None), (None, ("tensor", "fsdp")), ("fsdp", None)]:
        t = sharded(torch.zeros(13, 7), mesh((4, 2)), target_spec)
        ckpt.load_sharded({"t": t}, str(tmp_path))
        assert torch.equal(t.cpu(), host), target_spec


def test_partially_replicated_saves_one_copy_per_tile(tmp_path):
    host = torch.randn(6, 4)
    saved = sharded(host, mesh((4, 2)), ("tensor", None))  # 2 tiles, each on 4 devices
    target = sharded(torch.zeros(6, 4), mesh((4, 2)), (None, "fsdp"))
    reload(saved, target, tmp_path)
    assert torch.equal(target.cpu(), host)
    assert len(ckpt.read_metadata(str(tmp_path))["t"]["pieces"]) == 2


def test_replicated_unsharded_cpu_scalar_and_objects(tmp_path):
    m = mesh((4, 2))
    state = {
        "replicated": sharded(torch.randn(5, 3), m, (None, None)),
        "plain": torch.randn(4).to(DEV),
        "cpu": torch.randn(3, 3),
        "scalar": sharded(torch.tensor(2.5), m, ()),
        "nested": {"list": [torch.randn(2).to(DEV), 7], "tuple": (1, "two")},
        "wrapper": xs.mark_sharding(torch.randn(8, 2).to(DEV), m, ("fsdp", None)),
        "step": 12,
        "name": "run-1",
    }
    ref = {k: (v.cpu().clone() if isinstance(v, torch.Tensor) else v) for k, v in state.items()}
    ref_list0 = state["nested"]["list"][0].cpu().clone()
    ckpt.save_sharded(state, str(tmp_path))
    target = {
        "replicated": sharded(torch.zeros(5, 3), m, (None, "fsdp")),
        "plain": torch.zeros(4).to(DEV),
        "cpu": torch.zeros(3, 3),
        "scalar": torch.tensor(0.).to(DEV),
        "nested": {"list": [torch.zeros(2).to(DEV), 0], "tuple": None},
        "wrapper": xs.mark_sharding(torch.zeros(8, 2).to(DEV), m, ("tensor", None)),
        "step": 0,
        "name": None,
    }
    ckpt.load_sharded(target, str(tmp_path))
    for k in ("replicated", "plain", "cpu", "scalar"):
        assert torch.equal(target[k].cpu(), ref[k]), k
    assert torch.equal(target["wrapper"].global_tensor.cpu(), ref["wrapper"])
    assert isinstance(target["wrapper"], xs.XLAShardedTensor)
    assert torch.equal(target["nested"]["list"][0].cpu(), ref_list0)
    assert target["nested"]["list"][1] == 7 and target["nested"]["tuple"] == (1, "two")
    assert target["step"] == 12 and target["name"] == "run-1"
    assert target["cpu"].device.type == "cpu"


def test_load_into_cpu_consolidates(tmp_path):
    """A sharded checkpoint loads into plain CPU tensors: the full (consolidated) values."""
    host = torch.randn(9, 6)
    ckpt.save_sharded({"w": sharded(host, mesh((4, 2)), ("tensor", "fsdp"))}, str(tmp_path))
    out = {"w": torch.zeros(9, 6, dtype=torch.float64)}
    ckpt.load_sharded(out, str(tmp_path))
    assert torch.equal(out["w"], host.double())


def test_load_errors(tmp_path):
    m = mesh((4, 2))
    ckpt.save_sharded({"a": sharded(torch.randn(8, 4), m, ("fsdp", None)), "n": 1},
                      str(tmp_path))
    with pytest.raises(KeyError, match="Missing key in checkpoint state_dict: b"):
        ckpt.load_sharded({"a": torch.zeros(8, 4), "b": torch.zeros(1)}, str(tmp_path))
    with pytest.raises(ValueError, match=r"'a' has shape \[8, 4\], the target \[4, 8\]"):
        ckpt.load_sharded({"a": torch.zeros(4, 8)}, str(tmp_path))
    with pytest.raises(TypeError, match="'n' is a object, the target a tensor"):
        ckpt.load_sharded({"n": torch.zeros(1)}, str(tmp_path))
    with pytest.raises(FileNotFoundError, match="no committed checkpoint"):
        ckpt.load_sharded({"a": torch.zeros(8, 4)}, str(tmp_path / "nowhere"))
    # A damaged checkpoint (a piece dropped from the manifest) is detected, not zero-filled.
    manifest = _storage.read_manifest(str(tmp_path))
    manifest["entries"]["a"]["pieces"].pop()
    _storage.write_manifest(str(tmp_path), manifest)
    with pytest.raises(RuntimeError, match="the checkpoint is damaged"):
        ckpt.load_sharded({"a": sharded(torch.zeros(8, 4), m, ("fsdp", None))}, str(tmp_path))


# ---------------------------------------------------------------------------------------------
# Models and optimizer state


def make_model(mesh_obj, partition_specs):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 6)).to(DEV)
    for (name, p), s in zip(model.named_parameters(), partition_specs):
        if s is not None:
            xs.mark_sharding(p, mesh_obj, s)
    return model


def test_model_and_optimizer_reshard(tmp_path):
    m1 = mesh((4, 2))
    model = make_model(m1, [("fsdp", "tensor"), ("fsdp",), (None, "fsdp"), None])
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    for _ in range(2):
        x = torch.randn(8, 10).to(DEV)
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        xm.mark_step()
    ckpt.save_sharded({"model": model.state_dict(), "optim": opt.state_dict()}, str(tmp_path))
    ref_model = {k: v.cpu() for k, v in model.state_dict().items()}
    ref_state = {i: {k: v.cpu() for k, v in s.items()}
                 for i, s in opt.state_dict()["state"].items()}

    m2 = mesh((8, 1))
    model2 = make_model(m2, [(None, "fsdp"), None, ("fsdp", None), ("fsdp",)])
    opt2 = torch.optim.Adam(model2.parameters(), lr=0.5)
    ckpt.prime_optimizer(opt2)
    specs = {n: spec(p) for n, p in model2.named_parameters()}
    state = {"model": model2.state_dict(), "optim": opt2.state_dict()}
    ckpt.load_sharded(state, str(tmp_path))
    model2.load_state_dict(state["model"])
    opt2.load_state_dict(state["optim"])
    xm.mark_step()
    for n, p in model2.named_parameters():
        assert torch.equal(p.cpu(), ref_model[n]), n
        assert spec(p) == specs[n], n  # kept the new layout
    for i, s in opt2.state_dict()["state"].items():
        for k, v in s.items():
            assert torch.equal(v.cpu(), ref_state[i][k]), (i, k)
    assert opt2.param_groups[0]["lr"] == 0.1  # param_groups come from the checkpoint
    meta = ckpt.read_metadata(str(tmp_path))
    assert meta["optim.state.0.exp_avg"]["partition_spec"] == ["fsdp", "tensor"]
    assert meta["optim.state.0.step"]["device"] == "cpu"


# ---------------------------------------------------------------------------------------------
# Crash safety


def committed(path):
    return _storage.read_manifest(path)["data_file"]


def test_interrupted_data_write_keeps_previous(tmp_path, monkeypatch):
    path = str(tmp_path)
    m = mesh((4, 2))
    t = sharded(torch.ones(8, 8), m, ("fsdp", "tensor"))
    ckpt.save_sharded({"t": t, "step": 1}, path)
    first = committed(path)

    real_save = torch.save

    def crash_mid_write(obj, f):
        f.write(b"partial bytes of a checkpoint")  # some bytes hit the disk, then the crash
        raise KeyboardInterrupt("simulated crash")

    monkeypatch.setattr(_storage.torch, "save", crash_mid_write)
    with pytest.raises(KeyboardInterrupt):
        ckpt.save_sharded({"t": sharded(torch.full((8, 8), 2.), m, ("fsdp", "tensor")),
                           "step": 2}, path)
    monkeypatch.setattr(_storage.torch, "save", real_save)
    assert committed(path) == first
    assert sorted(os.listdir(path)) == sorted([_storage.MANIFEST, first])  # temp file removed
    target = {"t": sharded(torch.zeros(8, 8), m, (None, "fsdp")), "step": 0}
    ckpt.load_sharded(target, path)
    assert torch.equal(target["t"].cpu(), torch.ones(8, 8)) and target["step"] == 1


def test_interrupted_before_commit_keeps_previous(tmp_path, monkeypatch):
    path = str(tmp_path)
    m = mesh((4, 2))
    ckpt.save_sharded({"t": sharded(torch.ones(4, 4), m, ("fsdp", None))}, path)
    first = committed(path)

    def crash(*args, **kwargs):
        raise RuntimeError("simulated crash before the manifest")

    monkeypatch.setattr(_storage, "write_manifest", crash)
    with pytest.raises(RuntimeError, match="simulated crash"):
        ckpt.save_sharded({"t": sharded(torch.full((4, 4), 2.), m, ("fsdp", None))}, path)
    monkeypatch.undo()
    assert committed(path) == first
    assert len(os.listdir(path)) == 3  # manifest, old data, orphaned new data
    target = {"t": torch.zeros(4, 4)}
    ckpt.load_sharded(target, path)
    assert torch.equal(target["t"], torch.ones(4, 4))
    # The next successful save commits and removes the orphan and the superseded data file.
    ckpt.save_sharded({"t": sharded(torch.full((4, 4), 3.), m, ("fsdp", None))}, path)
    assert sorted(os.listdir(path)) == sorted([_storage.MANIFEST, committed(path)])
    ckpt.load_sharded(target, path)
    assert torch.equal(target["t"], torch.full((4, 4), 3.))


def test_killed_process_keeps_previous(tmp_path):
    """A hard kill (no exception handlers run) in the middle of writing the data file."""
    path = str(tmp_path)
    script = textwrap.dedent(f"""
        import os, sys
        os.environ["SPMD_NUM_DEVICES"] = "8"
        sys.path.insert(0, {ROOT!r})
        import numpy as np, torch, torch_spmd
        import torch_spmd.distributed.spmd as xs
        import torch_spmd.distributed.checkpoint as ckpt
        from torch_spmd.distributed.checkpoint import _storage
        mesh = xs.Mesh(np.arange(8), (8,), ("fsdp",))
        def state(v):
            t = torch.full((16, 4), float(v)).to(torch_spmd.device())
            xs.mark_sharding(t, mesh, ("fsdp", None))
            return {{"t": t}}
        ckpt.save_sharded(state(1), {path!r})
        def die(obj, f):
            f.write(b"x" * 100)
            f.flush()
            os._exit(9)
        _storage.torch.save = die
        ckpt.save_sharded(state(2), {path!r})
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 9, proc.stderr
    leftovers = [f for f in os.listdir(path) if f.endswith(".tmp")]
    assert len(leftovers) == 1  # the half-written temporary data file
    target = {"t": torch.zeros(16, 4)}
    ckpt.load_sharded(target, path)
    assert torch.equal(target["t"], torch.ones(16, 4))
    ckpt.save_sharded({"t": torch.full((16, 4), 5.)}, path)
    assert not [f for f in os.listdir(path) if f.endswith(".tmp")]


# ---------------------------------------------------------------------------------------------
# Resuming training


def gpt_setup():
    cfg = tiny_gpt.GPTConfig(block_size=16, n_layer=2, n_head=2, n_embd=32)
    m = mesh((N,), ("fsdp",))
    torch.manual_seed(5)
    policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={tiny_gpt.Block})
    model = FSDPv2(tiny_gpt.GPT(cfg), mesh=m, auto_wrap_policy=policy)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    return cfg, m, model, opt


def gpt_steps(cfg, m, model, opt, start, stop):
    data = tiny_gpt.corpus()
    losses = []
    for step in range(start, stop):
        x, y = tiny_gpt.batch_at(data, 16, cfg.block_size, 0, step)
        xd, yd = x.to(DEV), y.to(DEV)
        xs.mark_sharding(xd, m, ("fsdp", None))
        opt.zero_grad()
        loss = tiny_gpt.lm_loss(model(xd), yd)
        loss.backward()
        opt.step()
        xm.mark_step()
        losses.append(loss.item())
    return losses


def test_resume_gives_identical_losses(tmp_path):
    cfg, m, model, opt = gpt_setup()
    uninterrupted = gpt_steps(cfg, m, model, opt, 0, 8)

    cfg, m, model, opt = gpt_setup()
    mgr = ckpt.CheckpointManager(str(tmp_path), save_interval=4)
    first = gpt_steps(cfg, m, model, opt, 0, 4)
    assert mgr.save(4, {"model": model.state_dict(), "optim": opt.state_dict(), "step": 4})
    del model, opt

    cfg, m, model, opt = gpt_setup()  # a fresh process would start like this
    ckpt.prime_optimizer(opt)
    state = {"model": model.state_dict(), "optim": opt.state_dict(), "step": 0}
    mgr = ckpt.CheckpointManager(str(tmp_path), save_interval=4)
    mgr.restore(mgr.latest_step(), state)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optim"])
    resumed = gpt_steps(cfg, m, model, opt, state["step"], 8)
    assert first + resumed == uninterrupted  # bit for bit


# ---------------------------------------------------------------------------------------------
# CheckpointManager


def test_manager_interval_keep_and_restore(tmp_path):
    path = str(tmp_path / "run")
    mgr = ckpt.CheckpointManager(path, save_interval=2, max_to_keep=2)
    m = mesh((4, 2))
    assert mgr.all_steps() == [] and mgr.latest_step() is None
    for step in range(7):
        t = sharded(torch.full((4, 4), float(step)), m, ("fsdp", "tensor"))
        taken = mgr.save(step, {"t": t, "step": step})
        assert taken == (step % 2 == 0)
    assert mgr.all_steps() == [4, 6]  # 0 and 2 evicted (oldest first)
    assert sorted(os.listdir(path)) == ["4", "6"]
    assert mgr.save(7, {"t": torch.zeros(4, 4), "step": 7}, force=True)
    assert mgr.all_steps() == [6, 7] and mgr.latest_step() == 7
    target = {"t": sharded(torch.zeros(4, 4), m, (None, "fsdp")), "step": -1}
    mgr.restore(6, target)
    assert torch.equal(target["t"].cpu(), torch.full((4, 4), 6.)) and target["step"] == 6
    with pytest.raises(AssertionError, match="Cannot restore from untracked step 4. Valid steps "
                       "are: {6, 7}"):
        mgr.restore(4, target)
    # A new manager over the same directory sees the same steps.
    assert ckpt.CheckpointManager(path, save_interval=2).all_steps() == [6, 7]


def test_manager_async_and_uncommitted_steps(tmp_path):
    path = str(tmp_path)
    mgr = ckpt.CheckpointManager(path, save_interval=1, max_pending_async=2)
    t = torch.ones(8, 2).to(DEV)
    assert mgr.save_async(1, {"t": t})
    with torch.no_grad():
        t.mul_(3)  # the snapshot was taken already: later updates do not leak into step 1
    xm.mark_step()
    assert mgr.save_async(2, {"t": t})
    mgr.join()
    assert mgr.all_steps() == [1, 2]
    out = {"t": torch.zeros(8, 2)}
    mgr.restore(1, out)
    assert torch.equal(out["t"], torch.ones(8, 2))
    # A step directory whose first save never committed is not a step, and is cleaned up.
    os.makedirs(os.path.join(path, "3"))
    open(os.path.join(path, "3", ".data-abc.pt.x.tmp"), "wb").close()
    assert mgr.all_steps() == [1, 2]
    mgr.save(4, {"t": t})
    assert sorted(os.listdir(path)) == ["1", "2", "4"]


def test_manager_arguments():
    with pytest.raises(AssertionError, match="save_interval must be positive"):
        ckpt.CheckpointManager("/tmp/x", save_interval=0)
    with pytest.raises(AssertionError, match="max_pending_async must be positive"):
        ckpt.CheckpointManager("/tmp/x", save_interval=1, max_pending_async=0)
    with pytest.raises(AssertionError, match="max_to_keep must be non-negative"):
        ckpt.CheckpointManager("/tmp/x", save_interval=1, max_to_keep=-1)


def test_experimental_alias():
    import torch_spmd.experimental.distributed_checkpoint as xc
    assert xc.CheckpointManager is ckpt.CheckpointManager
    assert xc.prime_optimizer is ckpt.prime_optimizer
