"""Sharding of convolution and pooling, forward and backward (csrc/partition/rules/conv.cc,
pool.cc): batch (data parallel), channels, and spatial partitioning with halo exchange.

Every result is compared with the same program run eagerly on CPU. Collective expectations come
from an independent statement of when a spatial dim can be tiled (uniform halos: out * stride
== in, see rules/window.h), so a rule that partitions too much or too little fails here.
"""
import gc
import os
from collections import Counter

os.environ.setdefault("SPMD_NUM_DEVICES", "8")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import torch_spmd  # noqa: E402
import torch_spmd.core.xla_model as xm  # noqa: E402
import torch_spmd.debug as dbg  # noqa: E402
import torch_spmd.debug.metrics as met  # noqa: E402
import torch_spmd.distributed.spmd as xs  # noqa: E402
import torch_spmd.runtime as xr  # noqa: E402
from torch_spmd import _C  # noqa: E402

N = 8


def configure(n):
    if xr.global_runtime_device_count() != n:
        gc.collect()
        xr.configure_devices(n, "16GiB")


@pytest.fixture(scope="module", autouse=True)
def eight_devices():
    configure(N)
    xr.use_spmd()
    yield
    configure(N)


def mesh_4x2():
    return xs.Mesh(np.arange(N), (4, 2), ("data", "model"))


def mesh_8():
    return xs.Mesh(np.arange(N), (N,), ("data",))


def run(fn, cpu_args, specs, mesh, cotangent=True):
    """Runs ``fn`` on CPU and on the spmd device (args sharded by ``specs``, None = replicated),
    forward and backward through every floating arg. The loss is ``(out * g).sum()`` for a fixed
    random ``g`` (so that gradients are not all alike) or ``(out * out).sum()``.
    Returns (reference outputs, device outputs, stats of the whole step); each output list
    holds the forward result(s) and then every floating arg's gradient."""
    def go(args, to_dev):
        outs = fn(*args)
        outs = outs if isinstance(outs, tuple) else (outs,)
        y = outs[0]
        if cotangent:
            g = torch.randn(y.shape, generator=torch.Generator().manual_seed(7), dtype=y.dtype)
            loss = (y * (g.to(y.device) if to_dev else g)).sum()
        else:
            loss = (y * y).sum()
        loss.backward()
        return list(outs) + [a.grad for a in args if a.is_floating_point()]

    ref = go([a.clone().requires_grad_(a.is_floating_point()) for a in cpu_args], False)
    dev_args = []
    for a, spec in zip(cpu_args, specs):
        d = a.to(torch_spmd.device())
        if spec is not None:
            xs.mark_sharding(d, mesh, spec)
        dev_args.append(d.requires_grad_(a.is_floating_point()))
    outs = go(dev_args, True)
    xm.mark_step()
    stats = dbg.last_step_stats()
    return ref, [o.cpu() for o in outs], stats


def assert_all_close(ref, got):
    assert len(ref) == len(got)
    for i, (r, g) in enumerate(zip(ref, got)):
        assert g.shape == r.shape and g.dtype == r.dtype, f"output {i}"
        if r.is_floating_point():
            torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-4, msg=lambda m: f"output {i}: {m}")
        else:
            assert torch.equal(g, r), f"output {i} differs"


def kinds(stats):
    # A gradient nothing in the program consumes leaves it as a pending partial sum, reduced
    # when read: count those reductions with the in-program all-reduces.
    return Counter(c["kind"] for c in stats["collectives"] + stats["pending_reductions"])


def tileable(size, k, s, p, d=1):
    """A spatial dim is partitioned when its output tiles line up with its input tiles."""
    out = (size + 2 * p - d * (k - 1) - 1) // s + 1
    return out * s == size and p <= d * (k - 1)


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------------------------------
# Spatial partitioning: one conv, over a grid of geometries


@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("dilation", [1, 2])
@pytest.mark.parametrize("padding", [0, 1, 2])
@pytest.mark.parametrize("stride", [1, 2])
def test_conv2d_spatial_geometries(stride, padding, dilation, groups):
    x = randn(2, 4, 16, 12, seed=1)
    w = randn(6, 4 // groups, 3, 3, seed=2)
    b = randn(6, seed=3)

    def fn(x, w, b):
        return F.conv2d(x, w, b, stride=stride, padding=padding, dilation=dilation, groups=groups)

    ref, got, stats = run(fn, [x, w, b], [(None, None, "data", None), None, None], mesh_4x2())
    assert_all_close(ref, got)
    k = kinds(stats)
    if tileable(16, 3, stride, padding, dilation):
        # Halos only: no activation is gathered; grad_weight/bias partial sums are all-reduced.
        assert k["all-gather"] == 0, stats
        assert k["collective-permute"] >= 1 if padding > 0 or dilation > 1 else True, stats
        assert k["all-reduce"] >= 1, stats
    else:
        # Falls back to replicating the spatial dim: the input is gathered.
        assert k["all-gather"] >= 1 and k["collective-permute"] == 0, stats
    assert not stats["replicated_fallback_ops"]


@pytest.mark.parametrize("bias", [True, False])
def test_conv2d_spatial_h_and_w_bias(bias):
    # H over 'data', W over 'model': two halo exchanges, the second carrying the corners.
    x = randn(2, 3, 16, 8, seed=4)
    w = randn(5, 3, 5, 3, seed=5)
    args = [x, w] + ([randn(5, seed=6)] if bias else [])

    def fn(x, w, *b):
        return F.conv2d(x, w, b[0] if b else None, padding=(2, 1))

    specs = [(None, None, "data", "model"), None, None]
    ref, got, stats = run(fn, args, specs, mesh_4x2())
    assert_all_close(ref, got)
    k = kinds(stats)
    assert k["all-gather"] == 0 and k["collective-permute"] >= 4, stats
    # The output stays tiled on both dims.
    assert "all-reduce" in k


def test_conv1d_and_conv3d_spatial():
    x1, w1 = randn(2, 3, 32, seed=7), randn(4, 3, 3, seed=8)
    ref, got, stats = run(lambda x, w: F.conv1d(x, w, padding=1), [x1, w1],
                          [(None, None, "data"), None], mesh_8())
    assert_all_close(ref, got)
    assert kinds(stats)["all-gather"] == 0 and kinds(stats)["collective-permute"] > 0
    x3, w3 = randn(1, 2, 8, 4, 4, seed=9), randn(3, 2, 3, 3, 3, seed=10)
    ref, got, stats = run(lambda x, w: F.conv3d(x, w, padding=1), [x3, w3],
                          [(None, None, "data", None, None), None], mesh_4x2())
    assert_all_close(ref, got)
    assert kinds(stats)["all-gather"] == 0 and kinds(stats)["collective-permute"] > 0


def test_uneven_or_too_small_spatial_falls_back():
    # 18 rows over 4 devices: uneven; 8 rows over 8 devices with halo 2 > tile 1: too small.
    w = randn(4, 3, 3, 3, seed=11)
    x = randn(2, 3, 18, 8, seed=12)
    ref, got, stats = run(lambda x, w: F.conv2d(x, w, padding=1), [x, w],
                          [(None, None, "data", None), None], mesh_4x2())
    assert_all_close(ref, got)
    assert kinds(stats)["collective-permute"] == 0 and kinds(stats)["all-gather"] >= 1
    w5 = randn(4, 3, 5, 5, seed=13)
    x = randn(2, 3, 8, 8, seed=14)
    ref, got, stats = run(lambda x, w: F.conv2d(x, w, padding=2), [x, w5],
                          [(None, None, "data", None), None], mesh_8())
    assert_all_close(ref, got)
    assert kinds(stats)["collective-permute"] == 0 and kinds(stats)["all-gather"] >= 1


def test_halo_program_and_stats():
    x = randn(2, 3, 16, 16, seed=15)
    w = randn(4, 3, 5, 5, seed=16)
    d = x.to(torch_spmd.device())
    xs.mark_sharding(d, mesh_4x2(), (None, None, "data", None))
    y = F.conv2d(d, w.to(torch_spmd.device()), padding=2)
    text = dbg.partitioned_program([y])
    # One halo exchange of 2 rows each way; the local conv has no padding on the sharded dim.
    assert "spmd::halo_exchange" in text and "left=2 right=2" in text, text
    assert "padding=[0,2]" in text, text
    assert "all_gather" not in text, text
    permutes = met.counter_value("CollectivePermute") or 0
    xm.mark_step()
    stats = dbg.last_step_stats()
    # The runtime runs the halo as two collective-permutes as well.
    assert met.counter_value("CollectivePermute") - permutes == 2
    # Two collective-permutes of 2 rows of [2, 3, ., 16] f32 each.
    assert [(c["kind"], c["bytes"], c["group_size"]) for c in stats["collectives"]] == \
        [("collective-permute", 2 * 3 * 2 * 16 * 4, 4)] * 2
    torch.testing.assert_close(y.cpu(), F.conv2d(x, w, padding=2), rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------------------------
# Pooling


@pytest.mark.parametrize("k, s, p, dil, ceil", [
    (2, 2, 0, 1, False), (3, 2, 1, 1, False), (3, 1, 1, 1, False), (3, 2, 1, 2, False),
    (3, 3, 1, 1, True), (2, 2, 0, 1, True), (3, 2, 0, 1, False)])
@pytest.mark.parametrize("spec", [(None, None, "data", None), (None, None, "data", "model")])
def test_max_pool2d(k, s, p, dil, ceil, spec):
    x = randn(2, 3, 16, 16, seed=20)

    def fn(x):
        return F.max_pool2d(x, k, s, p, dilation=dil, ceil_mode=ceil, return_indices=True)

    ref, got, stats = run(fn, [x], [spec], mesh_4x2())
    assert_all_close(ref, got)  # values, global indices, input gradient
    out = ref[0].shape[2]
    sharded = tileable(16, k, s, p, dil) and out == (16 + 2 * p - dil * (k - 1) - 1) // s + 1
    assert (kinds(stats)["all-gather"] == 0) == sharded, stats


@pytest.mark.parametrize("k, s, p, include_pad, divisor", [
    (2, 2, 0, True, None), (3, 1, 1, True, None), (3, 2, 1, True, None), (3, 2, 1, False, None),
    (3, 1, 1, True, 5), (4, 4, 0, False, None)])
def test_avg_pool2d(k, s, p, include_pad, divisor):
    x = randn(2, 3, 16, 16, seed=21)

    def fn(x):
        return F.avg_pool2d(x, k, s, p, count_include_pad=include_pad, divisor_override=divisor)

    ref, got, stats = run(fn, [x], [(None, None, "data", "model")], mesh_4x2())
    assert_all_close(ref, got)
    sharded = tileable(16, k, s, p) and (include_pad or p == 0)
    assert (kinds(stats)["all-gather"] == 0) == sharded, stats


@pytest.mark.parametrize("out_size, sharded", [(8, True), (4, True), (1, False), (6, False)])
def test_adaptive_avg_pool2d(out_size, sharded):
    x = randn(2, 3, 16, 16, seed=22)
    ref, got, stats = run(lambda x: F.adaptive_avg_pool2d(x, out_size), [x],
                          [(None, None, "data", None)], mesh_4x2())
    assert_all_close(ref, got)
    # 16 rows pool into out_size rows: tiles line up when 4 devices divide out_size and
    # out_size divides 16. Output size 1 is recorded as a mean (a reduction: all-reduce).
    if sharded:
        assert not kinds(stats)["all-gather"] and not kinds(stats)["all-reduce"], stats
    elif out_size != 1:
        assert kinds(stats)["all-gather"] >= 1, stats


# ---------------------------------------------------------------------------------------------
# Batch and channel sharding


NET_PARAMS = ("w1", "b1", "w2", "w3", "w4", "b4")


def net_params(c=8):
    g = torch.Generator().manual_seed(30)
    return [torch.randn(c, 3, 3, 3, generator=g) * 0.3, torch.randn(c, generator=g),
            torch.randn(2 * c, c, 3, 3, generator=g) * 0.2,
            torch.randn(2 * c, 1, 3, 3, generator=g) * 0.3,
            torch.randn(c, 2 * c, 1, 1, generator=g) * 0.3, torch.randn(c, generator=g)]


def net(x, w1, b1, w2, w3, w4, b4):
    """conv -> relu -> conv(stride 2) -> max pool -> depthwise conv -> avg pool -> 1x1 conv."""
    y = F.relu(F.conv2d(x, w1, b1, padding=1))
    y = F.relu(F.conv2d(y, w2, None, stride=2, padding=1))
    y = F.max_pool2d(y, 3, 2, 1)
    y = F.conv2d(y, w3, None, padding=1, groups=w3.shape[0])
    y = F.avg_pool2d(y, 2)
    return F.conv2d(y, w4, b4)


def run_net(x, x_spec, mesh, param_specs=None, cotangent=True):
    """net on CPU and on device: (reference, device results, stats) with the output, the input
    gradient and the parameter gradients."""
    specs = [x_spec] + [(param_specs or {}).get(n) for n in NET_PARAMS]
    return run(net, [x] + net_params(), specs, mesh, cotangent)


def test_data_parallel_conv_net():
    x = randn(8, 3, 16, 16, seed=31)
    ref, got, stats = run_net(x, ("data", None, None, None), mesh_8())
    assert_all_close(ref, got)
    k = kinds(stats)
    # Every activation stays batch-sharded; only the weight gradients are all-reduced.
    assert set(k) == {"all-reduce"}, stats
    assert k["all-reduce"] == len(NET_PARAMS), stats
    assert not stats["replicated_fallback_ops"]


def test_data_parallel_uneven_batch():
    # 6 samples over 4 devices: padded rows must not leak into the weight gradients.
    x = randn(6, 3, 8, 8, seed=32)
    ref, got, stats = run_net(x, ("data", None, None, None), mesh_4x2())
    assert_all_close(ref, got)
    assert set(kinds(stats)) <= {"all-reduce"}, stats


def test_channel_sharded_weights():
    # Output channels of w1 and w2 on 'model' (the depthwise conv keeps them sharded, with
    # fewer groups per device), the 1x1 conv reduces over them: partial sums, then all-reduce.
    x = randn(4, 3, 16, 16, seed=33)
    specs = {"w1": ("model", None, None, None), "b1": ("model",),
             "w2": ("model", None, None, None), "w3": ("model", None, None, None),
             "w4": (None, "model", None, None)}
    ref, got, stats = run_net(x, ("data", None, None, None), mesh_4x2(), specs)
    assert_all_close(ref, got)
    assert not stats["replicated_fallback_ops"]
    assert kinds(stats)["all-gather"] <= 2, stats  # only w2's input channels, if anything


def test_input_channel_sharding_adds_bias_once():
    x = randn(2, 8, 8, 8, seed=34)
    w = randn(4, 8, 3, 3, seed=35)
    b = randn(4, seed=36)
    ref, got, stats = run(lambda x, w, b: F.conv2d(x, w, b, padding=1), [x, w, b],
                          [(None, "data", None, None), (None, "data", None, None), None], mesh_8())
    assert_all_close(ref, got)
    assert kinds(stats)["all-reduce"] >= 1 and kinds(stats)["all-gather"] == 0, stats


def test_grouped_conv_channel_sharding():
    # 4 groups; channels over 4 devices: one group per device, no communication forward.
    x = randn(2, 8, 8, 8, seed=37)
    w = randn(12, 2, 3, 3, seed=38)
    ref, got, stats = run(lambda x, w: F.conv2d(x, w, padding=1, groups=4), [x, w],
                          [(None, "data", None, None), ("data", None, None, None)], mesh_4x2())
    assert_all_close(ref, got)
    assert kinds(stats)["all-gather"] == 0 and not stats["replicated_fallback_ops"], stats


def test_transposed_conv():
    # Batch sharding passes through; a spatially sharded input is gathered (no halo rule).
    x = randn(4, 4, 8, 8, seed=39)
    w = randn(4, 3, 3, 3, seed=40)
    b = randn(3, seed=41)

    def fn(x, w, b):
        return F.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1)

    ref, got, stats = run(fn, [x, w, b], [("data", None, None, None), None, None], mesh_4x2())
    assert_all_close(ref, got)
    assert kinds(stats)["all-gather"] == 0, stats
    ref, got, stats = run(fn, [x, w, b], [(None, None, "data", None), None, None], mesh_4x2())
    assert_all_close(ref, got)


def test_batch_and_spatial_conv_net():
    # Batch over 'data', H over 'model': halos within each data-parallel group.
    x = randn(4, 3, 16, 16, seed=43)
    ref, got, stats = run_net(x, ("data", None, "model", None), mesh_4x2())
    assert_all_close(ref, got)
    k = kinds(stats)
    assert set(k) == {"collective-permute", "all-reduce"}, stats
    assert all(c["group_size"] == 2 for c in stats["collectives"] if c["kind"] == "collective-permute")


# ---------------------------------------------------------------------------------------------
# A spatially partitioned conv net: equal to CPU, collective-permutes only, memory / 4


def spatial_net_step(mesh, n_way):
    """Runs net on a [2, 3, 64, 64] input, unsharded and sharded on H; returns the sharded
    run's collectives and the unsharded/sharded ratios of (static, measured) peak memory."""
    x = randn(2, 3, 64, 64, seed=42)
    peaks = {}
    for spec in (None, (None, None, "data", None)):
        _C._reset_peak_memory()
        before = [xm.get_memory_info(i)["bytes_used"] for i in range(n_way)]
        ref, got, stats = run_net(x, spec, mesh, cotangent=False)
        measured = max(xm.get_memory_info(i)["peak_bytes_used"] - before[i] for i in range(n_way))
        assert_all_close(ref, got)
        peaks[spec is not None] = (stats["peak_bytes_per_device"], measured)
        if spec is not None:
            sharded_stats = stats
    gc.collect()
    ratios = tuple(peaks[False][i] / peaks[True][i] for i in range(2))
    return sharded_stats, ratios


@pytest.mark.parametrize("mesh_shape", [(4,), (4, 2), (8,)])
def test_spatial_conv_net(mesh_shape):
    n = int(np.prod(mesh_shape))
    configure(n)
    try:
        names = ("data", "model")[:len(mesh_shape)]
        mesh = xs.Mesh(np.arange(n), mesh_shape, names)
        stats, (static_ratio, measured_ratio) = spatial_net_step(mesh, n)
    finally:
        configure(N)
    k = kinds(stats)
    # Halos move as collective-permutes; the only other collectives are the all-reduces of the
    # weight gradients (partial over the spatial tiles) and of the loss.
    assert k["collective-permute"] >= 10 and set(k) == {"collective-permute", "all-reduce"}, stats
    assert k["all-reduce"] <= len(NET_PARAMS) + 1, stats
    ways = mesh_shape[0]
    print(f"mesh {mesh_shape}: peak memory / {static_ratio:.2f} (static), "
          f"/ {measured_ratio:.2f} (measured)")
    assert static_ratio >= 0.75 * ways and measured_ratio >= 0.75 * ways, (static_ratio, measured_ratio)
