"""torch_spmd.distributed.spmd (xs): meshes, partition specs, mark_sharding, local shards.

Expected sharding strings follow PyTorch/XLA's seed docs and its tile-assignment rule: the logical
mesh transposed to (axes used by the spec, in spec order) + (unused axes ascending), tuple axes
merged, device ids sorted within each replication group.
"""
import gc
import os

os.environ.setdefault("SPMD_NUM_DEVICES", "8")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

import torch_spmd  # noqa: E402
import torch_spmd.core.xla_model as xm  # noqa: E402
import torch_spmd.distributed.spmd as xs  # noqa: E402
import torch_spmd.runtime as xr  # noqa: E402
from torch_spmd import _C  # noqa: E402
from torch_spmd.distributed.spmd import Mesh, ShardingType, XLAShardedTensor  # noqa: E402

N = 8


pytestmark = pytest.mark.usefixtures("eight_devices")



def dev_tensor(x):
    return x.to(torch_spmd.device())


def mesh_4x2():
    return Mesh(np.arange(N), (4, 2), ("data", "model"))


def spec_of(t):
    return _C._get_sharding_spec(t)


# ---------------------------------------------------------------------------------------------
# Mesh


def test_mesh_basics():
    mesh = mesh_4x2()
    assert mesh.size() == 8
    assert list(mesh.shape().items()) == [("data", 4), ("model", 2)]
    assert mesh.get_logical_mesh().tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert mesh.get_axis_name_idx("model") == 1
    assert mesh.get_axis_name_idx("nope") is None
    unnamed = Mesh(list(range(8)), (2, 4))
    assert list(unnamed.shape().items()) == [(0, 2), (1, 4)]
    assert unnamed.get_axis_name_idx("data") is None


def test_mesh_str_round_trip_and_hash():
    mesh = mesh_4x2()
    text = str(mesh)
    assert text == ("{'device_ids': [0, 1, 2, 3, 4, 5, 6, 7], 'mesh_shape': (4, 2), "
                    "'axis_names': ('data', 'model')}")
    back = Mesh.from_str(text)
    assert back == mesh and hash(back) == hash(mesh)
    assert {mesh: 1}[back] == 1
    assert Mesh.from_str("not a mesh") is None
    assert Mesh.from_str("{'device_ids': [0]}") is None
    assert mesh != Mesh(np.arange(N), (4, 2), ("a", "b"))
    assert mesh != Mesh(np.arange(N), (2, 4), ("data", "model"))
    assert mesh != Mesh(np.arange(N)[::-1].copy(), (4, 2), ("data", "model"))


@pytest.mark.parametrize("args, message", [
    ((np.arange(4), (2, 2)),
     "Number of device IDs (4) must match the global number of devices (8)"),
    ((np.arange(8), (4, 2), ("a",)), "Number of axis names (1) must match mesh dimensions (2)"),
    ((np.arange(8), (4, 2), ("a", "a")), "Axis names must be unique, got: ('a', 'a')"),
    ((np.arange(8), (2, 2)), "Number of device IDs (8) must match mesh size (4)"),
    (([0, 0, 1, 2, 3, 4, 5, 6], (4, 2)), "Device IDs must be unique"),
    (([0, 1, 2, 3, 4, 5, 6, 9], (4, 2)), "Device IDs must be less than mesh size (8)"),
    # Axis names are checked before the mesh size, as in PyTorch/XLA.
    ((np.arange(8), (2, 2), ("a", "a")), "Axis names must be unique"),
])
def test_mesh_validation(args, message):
    with pytest.raises(AssertionError) as e:
        Mesh(*args)
    assert message in str(e.value)


def test_mesh_needs_devices(monkeypatch):
    monkeypatch.setattr(xr, "global_runtime_device_count", lambda: 0)
    with pytest.raises(AssertionError, match="This requires XLA supported device"):
        Mesh([], (0,))


def test_get_1d_mesh_and_global_mesh():
    mesh = xs.get_1d_mesh("data")
    assert mesh.mesh_shape == (8,) and mesh.axis_names == ("data",)
    assert mesh.get_logical_mesh().tolist() == list(range(8))
    assert xs.get_1d_mesh().axis_names is None
    assert xs.get_global_mesh() is None
    try:
        xs.set_global_mesh(mesh)
        assert xs.get_global_mesh() is mesh
    finally:
        xs.set_global_mesh(None)


# ---------------------------------------------------------------------------------------------
# HybridMesh: slices are blocks of prod(ici) consecutive ids; each axis is dcn-major.


@pytest.mark.parametrize("ici, dcn, names, expected", [
    ((1, 4), (2, 1), ("data", "fsdp"), [[0, 1, 2, 3], [4, 5, 6, 7]]),
    ((2, 2), (1, 2), None, [[0, 1, 4, 5], [2, 3, 6, 7]]),
    ((4, 1), (1, 2), None, [[0, 4], [1, 5], [2, 6], [3, 7]]),
    ((2, 4), None, ("x", "y"), [[0, 1, 2, 3], [4, 5, 6, 7]]),
    ((1, 2, 2), (2, 1, 1), None, [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]),
])
def test_hybrid_mesh_layout(ici, dcn, names, expected):
    mesh = xs.HybridMesh(ici_mesh_shape=ici, dcn_mesh_shape=dcn, axis_names=names)
    assert mesh.get_logical_mesh().tolist() == expected
    assert mesh.mesh_shape == tuple(i * d for i, d in zip(ici, dcn or (1,) * len(ici)))
    assert mesh.axis_names == names
    # The devices of one slice share their dcn coordinates.
    slice_size = int(np.prod(ici))
    logical = mesh.get_logical_mesh()
    for s in range(N // slice_size):
        coords = np.argwhere((logical // slice_size) == s)
        dcn_coords = {tuple(c // np.array(ici)) for c in coords}
        assert len(dcn_coords) == 1


def test_hybrid_mesh_is_keyword_only_and_usable():
    with pytest.raises(TypeError):
        xs.HybridMesh((1, 4), (2, 1))
    mesh = xs.HybridMesh(ici_mesh_shape=(1, 4), dcn_mesh_shape=(2, 1), axis_names=("dcn", "ici"))
    t = dev_tensor(torch.randn(8, 8))
    xs.mark_sharding(t, mesh, ("dcn", "ici"))
    assert spec_of(t) == "{devices=[2,4]0,1,2,3,4,5,6,7}"


@pytest.mark.parametrize("ici, dcn, message", [
    ((4,), None, "Provide dcn_mesh_shape to create a mesh for multislice"),
    ((8,), (2,), "Invalid dcn_mesh_shape for single slice mesh"),
    ((2,), (2,), "Number of slices 4 must equal the product of dcn_mesh_shape (2,)"),
    ((3,), None, "Number of devices 8 must equal the product of mesh_shape (3,)"),
])
def test_hybrid_mesh_errors(ici, dcn, message):
    with pytest.raises(ValueError) as e:
        xs.HybridMesh(ici_mesh_shape=ici, dcn_mesh_shape=dcn)
    assert message in str(e.value)


# ---------------------------------------------------------------------------------------------
# Partition specs -> sharding strings


MESH_4x2 = ((4, 2), ("data", "model"))
MESH_2x4 = ((2, 4), ("x", "y"))
MESH_2x2x2 = ((2, 2, 2), ("x", "y", "z"))
MESH_8 = ((8,), ("data",))


@pytest.mark.parametrize("mesh_args, shape, spec, expected", [
    (MESH_4x2, (8, 4), ("data", "model"), "{devices=[4,2]0,1,2,3,4,5,6,7}"),
    (MESH_4x2, (8, 4), (0, 1), "{devices=[4,2]0,1,2,3,4,5,6,7}"),
    (MESH_4x2, (8, 4), ("model", "data"), "{devices=[2,4]0,2,4,6,1,3,5,7}"),
    (MESH_4x2, (8, 4), ("model", None),
     "{devices=[2,1,4]0,2,4,6,1,3,5,7 last_tile_dim_replicate}"),
    (MESH_4x2, (8, 4), ("data", None), "{devices=[4,1,2]0,1,2,3,4,5,6,7 last_tile_dim_replicate}"),
    (MESH_4x2, (8, 4), (None, "model"),
     "{devices=[1,2,4]0,2,4,6,1,3,5,7 last_tile_dim_replicate}"),
    (MESH_4x2, (8, 4), (None, None), "{replicated}"),
    (MESH_4x2, (8, 4), (("data", "model"), None), "{devices=[8,1]0,1,2,3,4,5,6,7}"),
    (MESH_4x2, (8, 4), (("model", "data"), None), "{devices=[8,1]0,2,4,6,1,3,5,7}"),
    (MESH_4x2, (8,), ("data",), "{devices=[4,2]0,1,2,3,4,5,6,7 last_tile_dim_replicate}"),
    (MESH_4x2, (8,), (("data", "model"),), "{devices=[8]0,1,2,3,4,5,6,7}"),
    (MESH_4x2, (8, 8, 16), (None, "data", "model"), "{devices=[1,4,2]0,1,2,3,4,5,6,7}"),
    (MESH_4x2, (), (), "{replicated}"),
    (MESH_2x4, (8, 4), (0, 1), "{devices=[2,4]0,1,2,3,4,5,6,7}"),
    (MESH_2x4, (8, 4), (1, 0), "{devices=[4,2]0,4,1,5,2,6,3,7}"),
    (MESH_2x4, (8, 4), ("y", None), "{devices=[4,1,2]0,4,1,5,2,6,3,7 last_tile_dim_replicate}"),
    (MESH_2x4, (8, 4), ("x", None), "{devices=[2,1,4]0,1,2,3,4,5,6,7 last_tile_dim_replicate}"),
    (MESH_2x2x2, (8, 8), ("x", "z"), "{devices=[2,2,2]0,2,1,3,4,6,5,7 last_tile_dim_replicate}"),
    (MESH_2x2x2, (8, 8, 8), ("x", None, "z"),
     "{devices=[2,1,2,2]0,2,1,3,4,6,5,7 last_tile_dim_replicate}"),
    (MESH_2x2x2, (8, 8, 8), ("x", "y", "z"), "{devices=[2,2,2]0,1,2,3,4,5,6,7}"),
    (MESH_2x2x2, (8, 8, 8), ("z", "y", "x"), "{devices=[2,2,2]0,4,2,6,1,5,3,7}"),
    (MESH_2x2x2, (8, 8), (("x", "y"), "z"), "{devices=[4,2]0,1,2,3,4,5,6,7}"),
    (MESH_2x2x2, (8, 8), ("y", None), "{devices=[2,1,4]0,1,4,5,2,3,6,7 last_tile_dim_replicate}"),
    (MESH_8, (8,), ("data",), "{devices=[8]0,1,2,3,4,5,6,7}"),
    (MESH_8, (8, 3), (0, None), "{devices=[8,1]0,1,2,3,4,5,6,7}"),
    (MESH_8, (3, 8), (None, 0), "{devices=[1,8]0,1,2,3,4,5,6,7}"),
    # Lists work wherever tuples do (PyTorch/XLA's lru_cache rejects them).
    (MESH_4x2, (8, 4), ["model", "data"], "{devices=[2,4]0,2,4,6,1,3,5,7}"),
    (MESH_4x2, (8, 4), [["model", "data"], None], "{devices=[8,1]0,2,4,6,1,3,5,7}"),
])
def test_mark_sharding_spec_strings(mesh_args, shape, spec, expected):
    mesh = Mesh(np.arange(N), *mesh_args)
    x = torch.randn(shape)
    t = dev_tensor(x)
    st = xs.mark_sharding(t, mesh, spec)
    assert isinstance(st, XLAShardedTensor)
    assert spec_of(t) == expected  # in place
    assert st.sharding_spec == expected
    assert mesh.get_op_sharding(spec) == expected
    assert st.mesh_shape == mesh.mesh_shape
    assert st.partition_spec == tuple(tuple(p) if isinstance(p, list) else p for p in spec)
    assert torch.equal(t.cpu(), x)


def test_custom_device_order_sorts_replication_groups():
    mesh = Mesh([7, 6, 5, 4, 3, 2, 1, 0], (4, 2))
    t = dev_tensor(torch.randn(8, 8))
    xs.mark_sharding(t, mesh, (0, 1))
    assert spec_of(t) == "{devices=[4,2]7,6,5,4,3,2,1,0}"
    u = dev_tensor(torch.randn(8, 8))
    xs.mark_sharding(u, mesh, (0, None))
    assert spec_of(u) == "{devices=[4,1,2]6,7,4,5,2,3,0,1 last_tile_dim_replicate}"


@pytest.mark.parametrize("spec, expected", [
    (("data", "model"), ShardingType.TILED),
    (("model", None), ShardingType.PARTIAL),
    (("data",), ShardingType.PARTIAL),  # 1-D over a 2-D mesh: partial replication
    ((("data", "model"),), ShardingType.TILED),
    ((None, None), ShardingType.REPLICATED),
])
def test_sharding_types(spec, expected):
    mesh = mesh_4x2()
    t = dev_tensor(torch.randn((8, 4)[:len(spec)]))
    st = xs.mark_sharding(t, mesh, spec)
    assert st.sharding_type == expected
    assert xs.ShardingSpec(mesh, spec)._sharding_type == expected


def test_sharding_type_enum_values():
    assert [(m.name, int(m)) for m in ShardingType] == [
        ("REPLICATED", 0), ("MAXIMAL", 1), ("TUPLE", 2), ("TILED", 3), ("MANUAL", 4),
        ("PARTIAL", 5), ("UNKNOWN", 6)]


# ---------------------------------------------------------------------------------------------
# Validation errors (types and wording of PyTorch/XLA)


@pytest.mark.parametrize("shape, spec, error, message", [
    ((8, 4), ("data",), AssertionError,
     "Partition spec length (1) should be equal to the input rank (2)."),
    # The length is checked before anything else in the spec.
    ((8, 4), ("nope",), AssertionError, "Partition spec length (1)"),
    ((8, 4), ("nope", None), ValueError, "Axis name nope is not defined in the given mesh"),
    ((8, 4), ((("data",), "model"), None), AssertionError,
     "Partition spec cannot contain nested tuples"),
    ((8, 4), ([["data"], "model"], None), AssertionError,
     "Partition spec cannot contain nested tuples"),
    ((8, 4), (2, None), AssertionError,
     "partition_spec ((2, None)) contains out of bound index into mesh_shape."),
    ((8, 4), (-1, None), AssertionError, "contains out of bound index into mesh_shape."),
    ((8, 4), (0, 0), AssertionError,
     "Each device mesh dimension should appear at most once in partition_spec (0, 0)."),
    ((8, 4), (("data", "model"), "model"), AssertionError,
     "Each device mesh dimension should appear at most once in partition_spec"),
    ((8, 4), (1.0, None), ValueError,
     "Spec type <class 'float'> is not supported in partition spec"),
    ((8, 4), (True, None), ValueError,
     "Spec type <class 'bool'> is not supported in partition spec"),
])
def test_mark_sharding_validation(shape, spec, error, message):
    t = dev_tensor(torch.randn(shape))
    with pytest.raises(error) as e:
        xs.mark_sharding(t, mesh_4x2(), spec)
    assert message in str(e.value)
    assert spec_of(t) == ""  # nothing was annotated


def test_axis_name_on_unnamed_mesh_is_value_error():
    t = dev_tensor(torch.randn(8, 4))
    with pytest.raises(ValueError, match="Axis name data is not defined in the given mesh"):
        xs.mark_sharding(t, Mesh(np.arange(8), (4, 2)), ("data", None))


def test_mark_sharding_needs_spmd_tensor():
    with pytest.raises(RuntimeError, match="spmd device"):
        xs.mark_sharding(torch.randn(8, 4), mesh_4x2(), ("data", "model"))


def test_spec_must_be_a_sequence():
    with pytest.raises(TypeError, match="partition_spec must be a tuple"):
        xs.mark_sharding(dev_tensor(torch.randn(8)), mesh_4x2(), "data")


# ---------------------------------------------------------------------------------------------
# Repeated annotations, clear_sharding, wrappers


def test_repeated_mark_sharding_rules():
    mesh = mesh_4x2()
    x = torch.randn(8, 4)
    t = dev_tensor(x)
    xs.mark_sharding(t, mesh, (None, None))
    assert spec_of(t) == "{replicated}"
    xs.mark_sharding(t, mesh, ("data", "model"))  # new sharding over a replicated one
    assert spec_of(t) == "{devices=[4,2]0,1,2,3,4,5,6,7}"
    gc.collect()  # garbage of earlier tests is not freed between the two readings
    used = xm.get_memory_info(3)["bytes_used"]
    xs.mark_sharding(t, mesh, ("data", "model"))  # the same again: a no-op
    assert spec_of(t) == "{devices=[4,2]0,1,2,3,4,5,6,7}"
    assert xm.get_memory_info(3)["bytes_used"] == used
    with pytest.raises(RuntimeError, match="Existing annotation must be cleared first"):
        xs.mark_sharding(t, mesh, ("model", "data"))
    assert spec_of(t) == "{devices=[4,2]0,1,2,3,4,5,6,7}"
    assert xs.clear_sharding(t) is t
    assert spec_of(t) == ""
    xs.mark_sharding(t, mesh, ("model", "data"))
    assert spec_of(t) == "{devices=[2,4]0,2,4,6,1,3,5,7}"
    assert torch.equal(t.cpu(), x)


def test_annotate_custom_sharding_constrains_sharded_device_data():
    # PyTorch/XLA's custom sharding annotation: where mark_sharding refuses another sharding,
    # annotate_custom_sharding constrains the current value; the data keeps its layout until
    # the step reshards it, and the tensor keeps the new sharding from then on.
    x = torch.randn(2, 4, 64, 64)
    t = dev_tensor(x)
    xs.mark_sharding(t, Mesh(np.arange(N), (1, 1, 4, 2)), (0, 1, 2, 3))
    with pytest.raises(RuntimeError, match="Existing annotation must be cleared first"):
        xs.mark_sharding(t, Mesh(np.arange(N), (1, 1, 1, N)), (0, 1, 2, 3))
    st = xs.annotate_custom_sharding(t, Mesh(np.arange(N), (1, 1, 1, N)), (0, 1, 2, 3))
    assert isinstance(st, XLAShardedTensor) and st.global_tensor is t
    want = "{devices=[1,1,1,%d]%s}" % (N, ",".join(map(str, range(N))))
    assert spec_of(t) == want
    text = _C._graph_text([t])
    assert "spmd::sharding_constraint" in text and "{devices=[1,1,4,2]" in text  # not moved yet
    xm.mark_step()
    assert spec_of(t) == want and "sharding_constraint" not in _C._graph_text([t])
    assert [s.data.shape for s in st.local_shards] == [torch.Size([2, 4, 64, 64 // N])] * N
    assert torch.equal(t.cpu(), x)
    u = (t * 2).sum(-1)
    torch.testing.assert_close(u.cpu(), (x * 2).sum(-1))


def test_mark_sharding_accepts_wrapper_and_clear_returns_plain_tensor():
    mesh = mesh_4x2()
    x = torch.randn(8, 4)
    t = dev_tensor(x)
    st = xs.mark_sharding(t, mesh, (None, None))
    st2 = xs.mark_sharding(st, mesh, ("data", None))
    assert st2 is st
    assert st.partition_spec == ("data", None)
    assert spec_of(t) == "{devices=[4,1,2]0,1,2,3,4,5,6,7 last_tile_dim_replicate}"
    plain = xs.clear_sharding(st)
    assert plain is t and not isinstance(plain, XLAShardedTensor)
    assert spec_of(t) == "" and st.sharding_type is None
    assert torch.equal(t.cpu(), x)


def test_mark_sharding_on_pending_value_and_parameter():
    mesh = mesh_4x2()
    x = torch.randn(8, 4)
    t = dev_tensor(x) * 2  # not materialized yet: gets a sharding constraint
    xs.mark_sharding(t, mesh, ("data", None))
    assert spec_of(t) == "{devices=[4,1,2]0,1,2,3,4,5,6,7 last_tile_dim_replicate}"
    assert torch.equal(t.cpu(), x * 2)
    p = torch.nn.Parameter(dev_tensor(torch.randn(8, 4)))
    xs.mark_sharding(p, mesh, ("data", "model"))
    assert isinstance(p, torch.nn.Parameter) and p.requires_grad
    assert spec_of(p) == "{devices=[4,2]0,1,2,3,4,5,6,7}"


def test_annotations_that_tile_nothing_mix_with_data_of_the_default_mesh():
    # A (1, 1, 8) mesh's "data" and "fsdp" axes have one device each: a pending value marked
    # along them is replicated, in a step whose other inputs are laid out on the default
    # one-axis mesh (a one-GPU plan of a 3-D layout; it raised "Mesh axis index 1 is out of
    # range" before).
    mesh = Mesh(np.arange(N), (1, 1, N), ("data", "fsdp", "tensor"))
    w, ids = torch.randn(16, 4), torch.randint(0, 16, (2, 8))
    dw = dev_tensor(w)
    dw.mul_(1.0)
    xm.mark_step()  # w: device data on the default mesh
    dids = dev_tensor(ids) * 1
    xs.mark_sharding(dids, mesh, (("data", "fsdp"), None))
    out = torch.nn.functional.embedding(dids, dw).sum(-1)
    assert torch.equal(out.cpu(), torch.nn.functional.embedding(ids, w).sum(-1))


def test_sharded_tensor_wrapper_ops():
    mesh = mesh_4x2()
    x = torch.randn(8, 4)
    t = dev_tensor(x)
    st = xs.mark_sharding(t, mesh, ("data", "model"))
    assert st.shape == x.shape and st.dtype == x.dtype and st.device == t.device
    assert st.global_tensor is t
    y = st * 2 + 1
    assert isinstance(y, XLAShardedTensor) and y.mesh_shape is None
    host = y.cpu()  # wrapped too, as in PyTorch/XLA; host-memory methods see the CPU tensor
    assert isinstance(host, XLAShardedTensor) and host.device.type == "cpu"
    assert type(host.global_tensor) is torch.Tensor and torch.allclose(host, x * 2 + 1)
    assert host.sharding_spec == "" and host.sharding_type is None
    assert np.allclose(host.numpy(), (x * 2 + 1).numpy())
    assert host.tolist() == host.global_tensor.tolist()
    assert st.add_(1) is st  # in-place ops return the wrapper they ran on
    assert torch.allclose(t.cpu(), x + 1)
    assert repr(st).startswith("XLAShardedTensor(tensor(")
    assert xs.get_sharding_spec(st) == spec_of(t)


def test_wrap_if_sharded():
    t = dev_tensor(torch.randn(8, 4))
    assert xs.wrap_if_sharded(t) is t  # unsharded
    cpu = torch.randn(2)
    assert xs.wrap_if_sharded(cpu) is cpu
    assert xs.wrap_if_sharded("x") == "x"
    xs.mark_sharding(t, mesh_4x2(), ("data", None))
    w = xs.wrap_if_sharded(t)
    assert isinstance(w, XLAShardedTensor) and w.global_tensor is t
    assert xs.wrap_if_sharded(w) is w


# ---------------------------------------------------------------------------------------------
# Data: round trips, memory, local shards


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16,
                                   torch.int64, torch.int32, torch.int8, torch.uint8, torch.bool])
@pytest.mark.parametrize("shape, spec", [
    ((7, 5), ("data", "model")),
    ((9, 3), (("data", "model"), None)),
    ((3,), (("model", "data"),)),
    ((1, 2, 9), (None, "model", "data")),
    ((13, 1), ("data", None)),
])
def test_cpu_round_trip_is_exact(dtype, shape, spec):
    x = (torch.randn(shape) * 100).to(dtype)
    t = dev_tensor(x)
    xs.mark_sharding(t, mesh_4x2(), spec)
    back = t.cpu()
    assert back.dtype == dtype and torch.equal(back, x)


def test_sharded_bytes_per_device():
    gc.collect()
    before = [xm.get_memory_info(i)["bytes_used"] for i in range(N)]
    x = torch.randn(64, 32)  # 8192 bytes
    t = dev_tensor(x)
    # Held on the host until used or annotated (PyTorch/XLA's virtual device): annotating lays
    # out only the shards, so no device ever holds it whole.
    held = [xm.get_memory_info(i)["bytes_used"] - before[i] for i in range(N)]
    assert held == [0] * N
    xs.mark_sharding(t, xs.get_1d_mesh(), (0, None))
    eighth = [xm.get_memory_info(i)["bytes_used"] - before[i] for i in range(N)]
    assert eighth == [1024] * N
    u = dev_tensor(x)
    v = u + 0  # the first use uploads u replicated: every device holds it whole
    full = [xm.get_memory_info(i)["bytes_used"] - before[i] for i in range(N)]
    assert full == [1024 + 8192] * N
    del u, v
    gc.collect()
    xs.clear_sharding(t)
    xs.mark_sharding(t, mesh_4x2(), ("data", None))  # 4 tiles, 2 replicas each
    quarter = [xm.get_memory_info(i)["bytes_used"] - before[i] for i in range(N)]
    assert quarter == [2048] * N
    del t
    gc.collect()
    assert [xm.get_memory_info(i)["bytes_used"] for i in range(N)] == before


def test_local_shards_uneven_1d():
    x = torch.arange(10.).reshape(10, 1)
    st = xs.mark_sharding(dev_tensor(x), xs.get_1d_mesh("a"), ("a", None))
    shards = st.local_shards
    assert [s.shard_device for s in shards] == [f"SPMD:{i}" for i in range(N)]
    assert all(s.data.shape == (2, 1) for s in shards)  # ceil(10 / 8), padded
    assert [s.indices[0] for s in shards] == [
        slice(0, 2, 1), slice(2, 4, 1), slice(4, 6, 1), slice(6, 8, 1), slice(8, 10, 1),
        slice(10, 10, 1), slice(10, 10, 1), slice(10, 10, 1)]
    assert all(s.indices[1] == slice(0, 1, 1) for s in shards)
    assert all(s.replica_id == 0 for s in shards)
    assert shards[4].unpadded_data.flatten().tolist() == [8., 9.]
    assert shards[6].unpadded_data.numel() == 0
    assert shards[6].data.flatten().tolist() == [0., 0.]  # padding is zeros


def test_local_shards_uneven_2d():
    x = torch.arange(15.).reshape(5, 3)
    st = xs.mark_sharding(dev_tensor(x), mesh_4x2(), ("data", "model"))
    shards = st.local_shards
    assert all(s.data.shape == (2, 2) for s in shards)
    # Device 7 sits at (data=3, model=1): rows [6, 8) clamp to [5, 5), cols [2, 4) to [2, 3).
    assert shards[7].indices == [slice(5, 5, 1), slice(2, 3, 1)]
    assert shards[5].indices == [slice(4, 5, 1), slice(2, 3, 1)]
    assert shards[5].unpadded_data.tolist() == [[14.]]
    for s in shards:
        assert torch.equal(s.unpadded_data, x[tuple(s.indices)])


def test_local_shards_partial_and_replicated():
    x = torch.arange(24.).reshape(6, 4)
    st = xs.mark_sharding(dev_tensor(x), mesh_4x2(), ("model", None))
    shards = st.local_shards
    # Tile 0 (rows 0:3) on devices 0, 2, 4, 6; tile 1 on 1, 3, 5, 7.
    for d, s in enumerate(shards):
        tile = d % 2
        assert s.indices == [slice(3 * tile, 3 * tile + 3, 1), slice(0, 4, 1)]
        assert s.replica_id == d // 2
        assert torch.equal(s.data, x[3 * tile:3 * tile + 3])
    rep = xs.mark_sharding(dev_tensor(x), mesh_4x2(), (None, None))
    for d, s in enumerate(rep.local_shards):
        assert s.indices is Ellipsis and s.replica_id == d
        assert torch.equal(s.data, x) and torch.equal(s.unpadded_data, x)


def test_unpadded_data_setter():
    x = torch.arange(10.).reshape(10, 1)
    shard = xs.mark_sharding(dev_tensor(x), xs.get_1d_mesh(), (0, None)).local_shards[4]
    shard.unpadded_data = torch.tensor([[1.], [2.]])
    assert shard.data.flatten().tolist() == [1., 2.]


def test_load_local_shards_round_trip():
    x = torch.arange(45.).reshape(9, 5)
    t = dev_tensor(x)
    st = xs.mark_sharding(t, mesh_4x2(), ("data", "model"))
    shards = st.local_shards
    for s in shards:
        s.data.mul_(-1)
    st.load_local_shards_(shards[::-1])  # any order: matched by shard_device
    assert spec_of(t) == "{devices=[4,2]0,1,2,3,4,5,6,7}"
    assert torch.equal(t.cpu(), -x)


def test_load_local_shards_errors():
    x = torch.arange(45.).reshape(9, 5)
    st = xs.mark_sharding(dev_tensor(x), mesh_4x2(), ("data", "model"))
    shards = st.local_shards
    with pytest.raises(RuntimeError, match="Shards must be provided for all local devices"):
        st.load_local_shards_(shards[:-1])
    with pytest.raises(RuntimeError, match="Shards must be provided for all local devices"):
        st.load_local_shards_(shards[:-1] + [shards[0]])
    unpadded = [xs.XLAShard(s.unpadded_data.clone(), s.indices, s.shard_device, s.replica_id)
                for s in shards]
    with pytest.raises(RuntimeError, match="Input shard shape must include padding"):
        st.load_local_shards_(unpadded)
    rep = xs.mark_sharding(dev_tensor(x), mesh_4x2(), (None, None))
    with pytest.raises(RuntimeError, match="Replicated tensor should not be loaded from "
                       "_load_local_shards - use copy_"):
        rep.load_local_shards_(rep.local_shards)
    assert torch.equal(st.cpu(), x)  # failed loads left the data alone


# ---------------------------------------------------------------------------------------------
# ShardingSpec


def test_sharding_spec():
    mesh = mesh_4x2()
    spec = xs.ShardingSpec(mesh, ("data", None))
    assert spec.xla_spec(torch.randn(8, 4)) == \
        "{devices=[4,1,2]0,1,2,3,4,5,6,7 last_tile_dim_replicate}"
    assert spec.xla_spec(torch.randn(8)) is None
    assert spec.can_apply(torch.randn(8, 4)) and not spec.can_apply(torch.randn(8, 4, 2))
    t = dev_tensor(torch.randn(8, 4))
    spec.apply(t)
    assert spec_of(t) == "{devices=[4,1,2]0,1,2,3,4,5,6,7 last_tile_dim_replicate}"
    with pytest.raises(AssertionError):
        spec.apply(torch.randn(8, 4))
    with pytest.raises(ValueError, match="Axis name nope is not defined"):
        xs.ShardingSpec(mesh, ("nope",))
    assert xs.ShardingSpec(mesh, ["data", None]).partition_spec == ("data", None)


def test_private_spec_binding_still_works_on_plain_tensors():
    t = dev_tensor(torch.randn(4))
    assert _C._get_sharding_spec(t) == ""
    xs.mark_sharding(t, xs.get_1d_mesh(), (None,))
    assert _C._get_sharding_spec(t) == "{replicated}"


# ---------------------------------------------------------------------------------------------
# XLAShardedTensor as a DTensor (PyTorch/XLA 2.x): placements, _spec, device_mesh, redistribute


def _dtensor_has_shard_order():
    try:
        from torch.distributed.tensor._dtensor_spec import ShardOrderEntry  # noqa: F401
    except ImportError:
        return False
    return True


def test_sharded_tensor_is_a_dtensor_with_placements():
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.placement_types import Replicate, Shard
    mesh = mesh_4x2()
    st = xs.mark_sharding(dev_tensor(torch.randn(8, 4)), mesh, ("model", None))
    assert isinstance(st, DTensor)
    assert st.placements == (Replicate(), Shard(0))  # one per mesh axis: data, model
    spec = st._spec
    assert spec is st._spec  # cached
    assert spec.mesh.device_type == "xla" and spec.mesh.shape == (4, 2)
    assert spec.mesh.mesh_dim_names == ("data", "model")
    assert spec.mesh.mesh.tolist() == mesh.get_logical_mesh().tolist()
    assert st.device_mesh is spec.mesh
    assert tuple(spec.tensor_meta.shape) == (8, 4) and spec.tensor_meta.dtype == torch.float32
    # A dim tiled over two mesh axes is Shard(dim) on both, in the tuple's (major first) order.
    both = xs.mark_sharding(dev_tensor(torch.randn(8, 4)), mesh, (None, ("data", "model")))
    assert both.placements == (Shard(1), Shard(1))
    rev = xs.mark_sharding(dev_tensor(torch.randn(8, 4)), mesh, (("model", "data"), None))
    assert rev.placements == (Shard(0), Shard(0))
    if _dtensor_has_shard_order():
        assert [tuple(e.mesh_dims) for e in rev._spec.shard_order] == [(1, 0)]
    else:  # torch 2.6: the placements hold, the order cannot be expressed
        with pytest.raises(NotImplementedError, match=r"mesh axes \[\(1, 0\)\] out of increasing"):
            rev._spec
    # A custom device order is kept.
    custom = Mesh([7, 6, 5, 4, 3, 2, 1, 0], (8,))
    c = xs.mark_sharding(dev_tensor(torch.randn(8)), custom, (0,))
    assert c._spec.mesh.mesh.tolist() == [7, 6, 5, 4, 3, 2, 1, 0]
    # Re-annotating through wrap_as_sharded_tensor invalidates the cached spec.
    st2 = xs.wrap_as_sharded_tensor(st, mesh_shape=(8,), partition_spec=(0, None))
    assert st2 is st and st._spec is not spec and st.placements == (Shard(0),)


def test_sharded_tensor_without_annotation_has_no_placements():
    st = xs.mark_sharding(dev_tensor(torch.randn(8, 4)), mesh_4x2(), ("data", None))
    result = st + st  # an op result: no recorded annotation
    assert isinstance(result, XLAShardedTensor) and result.mesh_shape is None
    with pytest.raises(ValueError, match="mesh_shape must be specified"):
        result._spec
    with pytest.raises(ValueError, match="Placements not available"):
        result.placements
    with pytest.raises(ValueError, match="Placements not available"):
        XLAShardedTensor(torch.randn(3)).placements


def test_distribute_tensor_keeps_the_device_mesh():
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.placement_types import Shard
    dm = DeviceMesh("xla", torch.arange(N).reshape(2, 4), mesh_dim_names=("a", "b"))
    x = torch.randn(8, 12)
    st = xs.xla_distribute_tensor(x, dm, [Shard(1), Shard(0)])
    assert st.device_mesh is dm and st.placements == (Shard(1), Shard(0))
    assert st.sharding_spec == "{devices=[4,2]0,4,1,5,2,6,3,7}"
    assert torch.equal(st.global_tensor.cpu(), x)


def test_redistribute_is_a_resharded_copy():
    from torch.distributed.tensor.placement_types import Partial, Replicate, Shard
    mesh = xs.get_1d_mesh("x")
    x = torch.randn(8, 16)
    t = dev_tensor(x)
    st = xs.mark_sharding(t, mesh, ("x", None))
    for placements, pspec, expected in [([Shard(1)], (None, 0), "{devices=[1,8]0,1,2,3,4,5,6,7}"),
                                        ([Replicate()], (None, None), "{replicated}"),
                                        ([Shard(0)], (0, None), "{devices=[8,1]0,1,2,3,4,5,6,7}")]:
        r = st.redistribute(mesh, placements)
        assert r.partition_spec == pspec and r.placements == tuple(placements)
        torch_spmd.sync()
        assert spec_of(r.global_tensor) == expected
        assert torch.equal(r.global_tensor.cpu(), x)
        assert spec_of(t) == "{devices=[8,1]0,1,2,3,4,5,6,7}"  # the source keeps its sharding
    mesh2 = mesh_4x2()
    r = xs.mark_sharding(dev_tensor(x), mesh2, ("data", None)).redistribute(
        mesh2, [Replicate(), Shard(1)])
    torch_spmd.sync()
    assert r.partition_spec == (None, 1)
    assert spec_of(r.global_tensor) == mesh2.get_op_sharding((None, 1))
    with pytest.raises(IndexError):
        st.redistribute(mesh, [Shard(2)])
    with pytest.raises(ValueError):
        st.redistribute(mesh, [Shard(0), Shard(1)])
    with pytest.raises(NotImplementedError):
        st.redistribute(mesh, [Partial()])


# ---------------------------------------------------------------------------------------------
# Ops mixing an XLAShardedTensor with plain spmd tensors


def test_module_on_sharded_input_returns_sharded_tensor_with_autograd():
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    model.load_state_dict(ref.state_dict())
    model.to(torch_spmd.device())
    x = torch.randn(8, 16)
    st = xs.mark_sharding(dev_tensor(x), mesh_4x2(), ("data", None))
    plain_out = model(dev_tensor(x))
    assert type(plain_out) is torch.Tensor and "XLAShardedTensor" not in str(plain_out)
    out = model(st)
    assert isinstance(out, XLAShardedTensor) and "XLAShardedTensor" in str(out)
    assert out.grad_fn is not None and torch._is_functional_tensor(out.global_tensor)
    loss = (out * out).sum()
    loss.backward()
    ref_loss = (ref(x) ** 2).sum()
    ref_loss.backward()
    torch.testing.assert_close(loss.cpu().global_tensor, ref_loss.detach())
    for p, q in zip(model.parameters(), ref.parameters()):
        # Gradients are plain (functional) spmd tensors, as for a plain input.
        assert type(p.grad) is torch.Tensor and torch._is_functional_tensor(p.grad)
        torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-5, atol=1e-5)
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    torch.optim.SGD(ref.parameters(), lr=0.1).step()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-5, atol=1e-5)


def test_mixed_ops_keep_inplace_identity_and_leaf_gradients():
    x = torch.randn(8, 4)
    t = dev_tensor(x)
    st = xs.mark_sharding(dev_tensor(x), mesh_4x2(), ("data", None))
    s = st + t
    assert isinstance(s, XLAShardedTensor) and s.grad_fn is None
    assert torch.equal(s.cpu().global_tensor, x + x)
    assert t.add_(st) is t and type(t) is torch.Tensor  # in place: the tensor it ran on
    assert torch.equal(t.cpu(), x + x)
    leaf = XLAShardedTensor(dev_tensor(x), requires_grad=True)
    w = dev_tensor(torch.randn(4, 3))
    (leaf @ w).sum().backward()
    torch.testing.assert_close(leaf.grad.cpu(), w.cpu().sum(1).expand(8, 4).contiguous())


def test_clone_and_deepcopy_of_an_annotated_tensor_carry_its_sharding():
    # PyTorch/XLA's clone copies its source's sharding spec: the clone (and a deepcopy, which
    # clones) reports it before the step runs, is laid out so after it, and equals its source.
    import copy
    x = torch.randn(8, 6)
    for make_source in (lambda: dev_tensor(x), lambda: dev_tensor(x) * 2):  # data, pending
        src = make_source()
        xs.mark_sharding(src, mesh_4x2(), ("data", "model"))
        want = spec_of(src)
        assert want == "{devices=[4,2]0,1,2,3,4,5,6,7}"
        twin, deep = src.clone(), copy.deepcopy(src)
        assert spec_of(twin) == want and spec_of(deep) == want and spec_of(src) == want
        xm.mark_step()
        assert spec_of(twin) == want and spec_of(deep) == want
        assert torch.equal(twin.cpu(), src.cpu()) and torch.equal(deep.cpu(), src.cpu())
    # A clone of an unannotated tensor stays free for propagation to place.
    assert spec_of(dev_tensor(x).clone()) == ""
