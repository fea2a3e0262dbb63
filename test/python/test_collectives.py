"""The runtime's spmd collectives and device-local spmd ops against a numpy reference.

The reference is written from the contract in csrc/ir/internal_ops.h alone: groups are the
mesh's devices grouped over `axes` (first axis most major), member i holds tile i, a dim of
extent G tiled k ways has tiles of ceil(G/k) whose tails are padding. Inputs are integer-valued
so that every reduction is exact whatever the summation order.
"""
import itertools
import math

import numpy as np
import pytest
import torch

import torch_spmd  # noqa: F401  (loads and initialises the extension)
from torch_spmd import _C

N = 8


@pytest.fixture(scope="module", autouse=True)
def eight_devices():
    if _C._num_devices() != N:
        _C._configure_devices(N, 16 << 30)
    yield


# Every test runs both kernels of each op: the per-device one (a tensor per device) and the
# stacked one the executor uses (all devices' shards as one tensor, runtime/stacked_kernels.cc).
STACKED = {"on": False}


@pytest.fixture(autouse=True, params=[False, True], ids=["per_device", "stacked"])
def kernel_kind(request):
    STACKED["on"] = request.param
    yield request.param


def shuffled(n, seed):
    return np.random.default_rng(seed).permutation(n).tolist()


# (mesh shape, device ids): row-major ids, and shuffled ids so that device id and mesh position
# differ (results are indexed by device id, groups by mesh position).
MESHES = [
    ((8,), list(range(8))),
    ((4, 2), list(range(8))),
    ((2, 4), list(range(8))),
    ((2, 2, 2), list(range(8))),
    ((4, 2), shuffled(8, 1)),
    ((2, 2, 2), shuffled(8, 2)),
]


def ordered_axis_subsets(rank):
    """Every list of distinct axes, in every order, the empty list included."""
    out = []
    for r in range(rank + 1):
        out += [list(p) for p in itertools.permutations(range(rank), r)]
    return out


CASES = [(shape, ids, axes) for shape, ids in MESHES for axes in ordered_axis_subsets(len(shape))]
CASE_IDS = [f"{'x'.join(map(str, s))}{'' if ids == sorted(ids) else '-shuf'}-axes{''.join(map(str, a))}"
            for s, ids, a in CASES]
cases = pytest.mark.parametrize("shape,ids,axes", CASES, ids=CASE_IDS)


# ---------------------------------------------------------------------------------------------
# numpy reference


def ref_groups(ids, shape, axes):
    """DeviceGroups: transpose the id grid to (other axes..., axes...) and cut it into rows."""
    grid = np.array(ids).reshape(shape)
    rest = [a for a in range(len(shape)) if a not in axes]
    k = int(np.prod([shape[a] for a in axes])) if axes else 1
    return grid.transpose(rest + list(axes)).reshape(-1, k).tolist()


def tile(extent, k, i):
    """(offset, length, padded size) of tile i of an extent cut k ways."""
    s = -(-extent // k)
    off = min(i * s, extent)
    return off, min((i + 1) * s, extent) - off, s


def take(x, dim, start, length):
    return np.take(x, np.arange(start, start + length), axis=dim)


def pad_to(x, dim, size, value=0):
    widths = [(0, 0)] * x.ndim
    widths[dim] = (0, size - x.shape[dim])
    return np.pad(x, widths, constant_values=value)


def reduce(arrays, op):
    return {"sum": np.sum, "max": np.max, "min": np.min}[op](np.stack(arrays), axis=0)


def ref_all_gather(xs, groups, dim, size):
    out = [None] * N
    for g in groups:
        k = len(g)
        full = np.concatenate([take(xs[d], dim, 0, tile(size, k, i)[1]) for i, d in enumerate(g)],
                              axis=dim)
        for d in g:
            out[d] = full
    return out


def ref_all_reduce(xs, groups, op):
    out = [None] * N
    for g in groups:
        r = reduce([xs[d] for d in g], op)
        for d in g:
            out[d] = r
    return out


def ref_reduce_scatter(xs, groups, dim, op, size):
    out = [None] * N
    for g in groups:
        r = reduce([xs[d] for d in g], op)
        for i, d in enumerate(g):
            off, length, s = tile(size, len(g), i)
            out[d] = pad_to(take(r, dim, off, length), dim, s)
    return out


def ref_all_to_all(xs, groups, split_dim, concat_dim, split_size, concat_size):
    out = [None] * N
    for g in groups:
        k = len(g)
        for j, dj in enumerate(g):
            soff, slen, ss = tile(split_size, k, j)
            parts = [take(take(xs[di], concat_dim, 0, tile(concat_size, k, i)[1]), split_dim, soff, slen)
                     for i, di in enumerate(g)]
            out[dj] = pad_to(np.concatenate(parts, axis=concat_dim), split_dim, ss)
    return out


def ref_permute(xs, groups, pairs):
    out = [None] * N
    for g in groups:
        for d in g:
            out[d] = np.zeros_like(xs[d])
        for src, dst in pairs:
            out[g[dst]] = xs[g[src]]
    return out


def ref_shard_slice(xs, groups, dim, size):
    out = [None] * N
    for g in groups:
        for i, d in enumerate(g):
            off, length, s = tile(size, len(g), i)
            out[d] = pad_to(take(xs[d], dim, off, length), dim, s)
    return out


def ref_mask_pad(xs, groups, dim, size, value):
    out = [None] * N
    for g in groups:
        for i, d in enumerate(g):
            _, length, s = tile(size, len(g), i)
            out[d] = pad_to(take(xs[d], dim, 0, length), dim, s, value)
    return out


def ref_halo(xs, groups, dim, left, right, value):
    out = [None] * N
    for g in groups:
        k = len(g)
        for i, d in enumerate(g):
            x = xs[d]
            s = x.shape[dim]
            lhalo = take(xs[g[i - 1]], dim, s - left, left) if i > 0 else \
                np.full_like(take(x, dim, 0, left), value)
            rhalo = take(xs[g[i + 1]], dim, 0, right) if i + 1 < k else \
                np.full_like(take(x, dim, 0, right), value)
            out[d] = np.concatenate([lhalo, x, rhalo], axis=dim)
    return out


# ---------------------------------------------------------------------------------------------
# helpers


def group_size(shape, axes):
    return int(np.prod([shape[a] for a in axes])) if axes else 1


def random_inputs(per_device_shape, seed, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return [rng.integers(-50, 50, size=per_device_shape).astype(dtype) for _ in range(N)]


def run(kind, xs, ids, shape, axes, **attrs):
    outs = _C._run_collective(kind, [torch.from_numpy(np.ascontiguousarray(x)) for x in xs], ids,
                              list(shape), axes, attrs, stacked=STACKED["on"])
    assert len(outs) == N
    return outs


def assert_matches(outs, want):
    for d in range(N):
        got = outs[d].numpy()
        assert got.shape == want[d].shape, f"device {d}: shape {got.shape} != {want[d].shape}"
        assert got.dtype == want[d].dtype, f"device {d}: dtype {got.dtype} != {want[d].dtype}"
        np.testing.assert_array_equal(got, want[d], err_msg=f"device {d}")


def sizes_for(k):
    """Even, uneven (short last tile) and tiny (trailing tiles empty) extents for k tiles."""
    return sorted({3 * k, max(3 * k - 2, 1), 1})


# ---------------------------------------------------------------------------------------------
# collectives


@cases
def test_all_gather(shape, ids, axes):
    groups = ref_groups(ids, shape, axes)
    k = group_size(shape, axes)
    for size in sizes_for(k):
        # The padded tail of each tile holds garbage that must not reach the result.
        xs = random_inputs((2, tile(size, k, 0)[2], 3), seed=size)
        want = ref_all_gather(xs, groups, 1, size)
        assert_matches(run("all_gather", xs, ids, shape, axes, dim=1, size=size), want)


@cases
@pytest.mark.parametrize("op", ["sum", "max", "min"])
def test_all_reduce(shape, ids, axes, op):
    groups = ref_groups(ids, shape, axes)
    xs = random_inputs((3, 5), seed=7)
    assert_matches(run("all_reduce", xs, ids, shape, axes, op=op), ref_all_reduce(xs, groups, op))


@pytest.mark.parametrize("op", ["sum", "max", "min"])
def test_all_reduce_integer_dtype(op):
    shape, ids, axes = (2, 4), list(range(8)), [1]
    xs = random_inputs((4,), seed=3, dtype=np.int64)
    want = ref_all_reduce(xs, ref_groups(ids, shape, axes), op)
    assert_matches(run("all_reduce", xs, ids, shape, axes, op=op), want)


@cases
@pytest.mark.parametrize("op", ["sum", "max", "min"])
def test_reduce_scatter(shape, ids, axes, op):
    groups = ref_groups(ids, shape, axes)
    k = group_size(shape, axes)
    for size in sizes_for(k):
        xs = random_inputs((size, 2), seed=size)
        want = ref_reduce_scatter(xs, groups, 0, op, size)  # zero padding is part of the contract
        assert_matches(run("reduce_scatter", xs, ids, shape, axes, dim=0, op=op, size=size), want)


@cases
@pytest.mark.parametrize("split_dim,concat_dim", [(0, 2), (2, 0)])
def test_all_to_all(shape, ids, axes, split_dim, concat_dim):
    groups = ref_groups(ids, shape, axes)
    k = group_size(shape, axes)
    for split_size, concat_size in [(2 * k, 3 * k), (max(2 * k - 1, 1), 1), (1, max(3 * k - 2, 1))]:
        per_device = [0, 2, 0]
        per_device[split_dim] = split_size
        per_device[concat_dim] = tile(concat_size, k, 0)[2]
        xs = random_inputs(tuple(per_device), seed=split_size * 31 + concat_size)
        want = ref_all_to_all(xs, groups, split_dim, concat_dim, split_size, concat_size)
        outs = run("all_to_all", xs, ids, shape, axes, split_dim=split_dim, concat_dim=concat_dim,
                   split_size=split_size, concat_size=concat_size)
        assert_matches(outs, want)


def random_pairs(k, rng):
    """A random subset of destinations, each with a random source (sources may repeat)."""
    dsts = rng.permutation(k)[: rng.integers(0, k + 1)]
    return [(int(rng.integers(0, k)), int(dst)) for dst in dsts]


@cases
def test_collective_permute(shape, ids, axes):
    groups = ref_groups(ids, shape, axes)
    k = group_size(shape, axes)
    rng = np.random.default_rng(k * 100 + len(axes))
    pair_sets = [[(i, (i + 1) % k) for i in range(k)],  # ring shift
                 [(i, i + 1) for i in range(k - 1)],    # shift with no wrap: member 0 gets zeros
                 []]                                    # nobody receives
    pair_sets += [random_pairs(k, rng) for _ in range(3)]
    for pairs in pair_sets:
        xs = random_inputs((2, 3), seed=len(pairs))
        want = ref_permute(xs, groups, pairs)
        assert_matches(run("collective_permute", xs, ids, shape, axes, pairs=pairs), want)


def test_collective_permute_receiver_without_source_gets_zeros():
    shape, ids, axes = (8,), list(range(8)), [0]
    xs = [np.full((2,), d + 1.0, dtype=np.float32) for d in range(N)]
    outs = run("collective_permute", xs, ids, shape, axes, pairs=[(3, 0), (3, 5)])
    got = [o.numpy().tolist() for o in outs]
    assert got[0] == [4.0, 4.0] and got[5] == [4.0, 4.0]
    assert all(got[d] == [0.0, 0.0] for d in range(N) if d not in (0, 5))


# ---------------------------------------------------------------------------------------------
# device-local ops and halo exchange


@cases
def test_shard_slice(shape, ids, axes):
    groups = ref_groups(ids, shape, axes)
    k = group_size(shape, axes)
    for size in sizes_for(k):
        # Each device's input differs, so a wrong member index cannot go unnoticed.
        xs = random_inputs((3, size), seed=size)
        want = ref_shard_slice(xs, groups, 1, size)
        assert_matches(run("shard_slice", xs, ids, shape, axes, dim=1, size=size), want)


@cases
@pytest.mark.parametrize("value", [float("-inf"), 7.0])
def test_mask_pad(shape, ids, axes, value):
    groups = ref_groups(ids, shape, axes)
    k = group_size(shape, axes)
    for size in sizes_for(k):
        xs = random_inputs((tile(size, k, 0)[2], 2), seed=size)
        want = ref_mask_pad(xs, groups, 0, size, value)
        assert_matches(run("mask_pad", xs, ids, shape, axes, dim=0, size=size, value=value), want)


@cases
@pytest.mark.parametrize("left,right", [(1, 2), (0, 1), (2, 0), (3, 3), (0, 0)])
def test_halo_exchange(shape, ids, axes, left, right):
    groups = ref_groups(ids, shape, axes)
    xs = random_inputs((2, 3, 2), seed=left * 10 + right)  # tiles of 3 on dim 1
    want = ref_halo(xs, groups, 1, left, right, -5.0)
    outs = run("halo_exchange", xs, ids, shape, axes, dim=1, left=left, right=right, value=-5.0)
    assert_matches(outs, want)


def test_halo_exchange_ends_get_value():
    shape, ids, axes = (8,), list(range(8)), [0]
    xs = [np.full((2,), float(d), dtype=np.float32) for d in range(N)]
    outs = run("halo_exchange", xs, ids, shape, axes, dim=0, left=1, right=1, value=-1.0)
    assert outs[0].tolist() == [-1.0, 0.0, 0.0, 1.0]
    assert outs[3].tolist() == [2.0, 3.0, 3.0, 4.0]
    assert outs[7].tolist() == [6.0, 7.0, 7.0, -1.0]


# ---------------------------------------------------------------------------------------------
# metrics


def metric(name):
    data = _C._metric_data(name)
    return (0, 0.0, []) if data is None else data


def test_metrics_count_each_collective_and_its_bytes():
    shape, ids = (4, 2), list(range(8))
    _C._clear_counters()
    _C._clear_metrics()
    xs = random_inputs((3, 4), seed=0)  # 48 bytes per device
    run("all_gather", xs, ids, shape, [0], dim=0, size=12)
    run("all_reduce", xs, ids, shape, [1], op="sum")
    run("all_reduce", xs, ids, shape, [0, 1], op="max")
    run("reduce_scatter", xs, ids, shape, [1], dim=1, op="sum", size=4)
    run("all_to_all", xs, ids, shape, [1], split_dim=1, concat_dim=0, split_size=4, concat_size=6)
    run("collective_permute", xs, ids, shape, [0], pairs=[(0, 1)])
    expected = {"CollectiveAllGather": 1, "CollectiveAllReduce": 2, "CollectiveReduceScatter": 1,
                "CollectiveAllToAll": 1, "CollectivePermute": 1}
    for name, count in expected.items():
        assert _C._counter_value(name) == count, name
        samples, total, values = metric(name + "Bytes")
        assert (samples, total, values) == (count, 48.0 * count, [48.0] * count), name


def test_halo_exchange_counts_its_collective_permutes():
    shape, ids = (8,), list(range(8))
    xs = random_inputs((4, 5), seed=0)  # float32 rows of 20 bytes
    _C._clear_counters()
    _C._clear_metrics()
    run("halo_exchange", xs, ids, shape, [0], dim=0, left=1, right=2, value=0.0)
    assert _C._counter_value("CollectivePermute") == 2
    assert metric("CollectivePermuteBytes")[2] == [20.0, 40.0]
    # A group of one has no neighbours: nothing moves, so nothing is counted.
    _C._clear_counters()
    run("halo_exchange", xs, ids, shape, [], dim=0, left=1, right=2, value=0.0)
    assert _C._counter_value("CollectivePermute") == 0


def test_device_local_ops_count_no_collective():
    shape, ids = (8,), list(range(8))
    _C._clear_counters()
    run("shard_slice", random_inputs((8,), 0), ids, shape, [0], dim=0, size=8)
    run("mask_pad", random_inputs((2,), 0), ids, shape, [0], dim=0, size=13, value=0.0)
    assert not [n for n in _C._counter_names() if n.startswith("Collective")]


# ---------------------------------------------------------------------------------------------
# sharing and memory accounting


@pytest.mark.parametrize("kind,attrs", [("all_gather", dict(dim=0, size=6)),
                                        ("all_reduce", dict(op="sum"))])
def test_group_results_share_one_host_tensor(kind, attrs):
    shape, ids, axes = (2, 2, 2), shuffled(8, 5), [2, 0]
    groups = ref_groups(ids, shape, axes)
    outs = run(kind, random_inputs((2, 3), seed=1), ids, shape, axes, **attrs)
    ptrs = {d: outs[d].data_ptr() for d in range(N)}
    for g in groups:
        assert len({ptrs[d] for d in g}) == 1, f"group {g} does not share its result"
    assert len({ptrs[g[0]] for g in groups}) == len(groups), "different groups share a result"


def test_shard_slice_of_a_replicated_input_is_computed_once_per_tile():
    shape, ids, axes = (4, 2), list(range(8)), [0]
    x = torch.arange(10.0)
    outs = _C._run_collective("shard_slice", [x] * N, ids, list(shape), axes, {"dim": 0, "size": 10},
                              stacked=STACKED["on"])
    groups = ref_groups(ids, shape, axes)
    for i in range(4):
        members = [g[i] for g in groups]
        assert len({outs[d].data_ptr() for d in members}) == 1
    # Device 6 sits at mesh position (3, 0): tile 3 of 10 in tiles of 3 is one row + padding.
    assert outs[6].tolist() == [9.0, 0.0, 0.0]


@pytest.mark.parametrize("kind,attrs,out_shape", [
    ("all_gather", dict(dim=0, size=7), (7, 4)),
    ("all_reduce", dict(op="min"), (2, 4)),
    ("reduce_scatter", dict(dim=1, op="sum", size=4), (2, 1)),
    ("halo_exchange", dict(dim=0, left=1, right=1, value=0.0), (4, 4)),
])
# Groups of 4 devices, strided (4x2 over axis 0) or adjacent ids (2x4 over axis 1).
@pytest.mark.parametrize("shape,axes", [((4, 2), [0]), ((2, 4), [1])])
def test_every_device_accounts_its_result_bytes(kind, attrs, out_shape, shape, axes):
    ids = list(range(8))
    xs = random_inputs((2, 4), seed=0)
    before = [_C._memory_info(d)["bytes_used"] for d in range(N)]
    _C._reset_peak_memory()
    outs = run(kind, xs, ids, shape, axes, **attrs)
    assert tuple(outs[0].shape) == out_shape
    in_bytes, out_bytes = 2 * 4 * 4, math.prod(out_shape) * 4
    for d in range(N):
        info = _C._memory_info(d)
        assert info["peak_bytes_used"] - before[d] == in_bytes + out_bytes, f"device {d}"
        assert info["bytes_used"] == before[d], f"device {d} still holds buffers"


# ---------------------------------------------------------------------------------------------
# errors


@pytest.mark.parametrize("kind,attrs,per_device,message", [
    ("collective_permute", dict(pairs=[(0, 1), (2, 1)]), (2,), "more than one source"),
    ("collective_permute", dict(pairs=[(0, 8)]), (2,), "out of range"),
    ("all_gather", dict(dim=0, size=16), (3,), "extent 2"),
    ("reduce_scatter", dict(dim=0, op="sum", size=5), (4,), "extent 5"),
    ("reduce_scatter", dict(dim=0, op="prod", size=4), (4,), "unknown reduce op"),
    ("all_to_all", dict(split_dim=0, concat_dim=0, split_size=2, concat_size=2), (2,), "differ"),
    ("halo_exchange", dict(dim=0, left=3, right=0, value=0.0), (2,), "beyond"),
    ("shard_slice", dict(dim=0, size=8, bogus=1), (8,), "no attribute 'bogus'"),
    ("mask_pad", dict(dim=0, size=8), (1,), "needs the attribute 'value'"),
])
def test_invalid_collectives_raise(kind, attrs, per_device, message):
    xs = random_inputs(per_device, seed=0)
    with pytest.raises(ValueError, match=message):
        run(kind, xs, list(range(8)), (8,), [0], **attrs)


def test_inputs_of_different_shapes_are_rejected():
    xs = random_inputs((2,), seed=0)
    xs[5] = np.zeros((3,), dtype=np.float32)
    with pytest.raises(ValueError, match="one shape and dtype"):
        run("all_reduce", xs, list(range(8)), (8,), [0], op="sum")
