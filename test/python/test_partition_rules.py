"""Every sharding-rule family, differentially: each op runs on meshes (8,), (4,2) and (2,2,2)
with several input shardings (uneven dims included, padding poisoned with NaN), forward and
backward, and must match CPU. Where a rule promises a communication-free layout (pointwise on
matching shardings, a contraction sharded alike on both sides, a sum over a sharded dim, ...)
the test also asserts that no collective ran and nothing fell back to replication.

float64 keeps the tolerances tight (1e-9): a partitioning mistake is never within them.
"""
import itertools

import pytest
import torch
import torch.nn.functional as F

from spmd_diff import (MESH_AXES, check, constrain, ensure_devices, mesh_of, only, run,
                       assert_same)

MESHES = [(8,), (4, 2), (2, 2, 2)]


@pytest.fixture(scope="module", autouse=True)
def devices():
    ensure_devices()
    yield


def T(*shape, seed=0, positive=False):
    g = torch.Generator().manual_seed(seed + 7 * len(shape) + sum(shape))
    t = torch.randn(*shape, generator=g, dtype=torch.float64)
    return t.abs() + 0.5 if positive else t


def all_specs(axes, rank):
    """Every partition spec of a rank-`rank` tensor over mesh axes `axes` (each axis used at
    most once; several axes on one dim in every order)."""
    out = set()
    for perm in itertools.permutations(axes):
        for assign in itertools.product(range(-1, rank), repeat=len(axes)):
            dims = [[] for _ in range(rank)]
            for a, d in zip(perm, assign):
                if d >= 0:
                    dims[d].append(a)
            out.add(tuple(None if not d else (d[0] if len(d) == 1 else tuple(d)) for d in dims))
    return sorted(out, key=repr)


def pick_specs(mesh_shape, rank, count, salt=0):
    """A deterministic sample of `count` specs, always including the fully replicated one and
    ones that shard every axis."""
    specs = all_specs(MESH_AXES[mesh_shape], rank)
    if len(specs) <= count:
        return specs
    full = [s for s in specs if sum(len(x) if isinstance(x, tuple) else x is not None
                                    for x in s) == len(mesh_shape)]
    rest = [s for s in specs if s not in full]
    step = max(1, len(rest) // max(1, count - 2))
    picked = [full[(salt * 3) % len(full)], full[(salt * 5 + 1) % len(full)]]
    picked += rest[salt % step::step]
    seen, res = set(), []
    for s in picked:
        if s not in seen:
            seen.add(s)
            res.append(s)
    return res[:count]


def mesh_spec_cases(rank, count, salt=0):
    return [(m, s) for m in MESHES for s in pick_specs(m, rank, count, salt)]


def dedupe(spec):
    """``spec`` with any mesh axis used a second time replaced by None (for specs built from
    other tensors' entries)."""
    seen, out = set(), []
    for e in spec:
        axes = axes_of(e)
        if any(a in seen for a in axes):
            out.append(None)
        else:
            seen.update(axes)
            out.append(e)
    return tuple(out)


def spread(names, cases, per_name):
    """(name, *case) pairs giving each name `per_name` of the cases, rotating so that together
    the names cover all of them."""
    names = sorted(names)
    out = []
    for k, name in enumerate(names):
        for j in range(per_name):
            case = cases[(k * per_name + j) % len(cases)]
            out.append((name,) + tuple(case))
    return out


def axes_of(entry):
    if entry is None:
        return ()
    return entry if isinstance(entry, tuple) else (entry,)


def ids(cases):
    return [f"{m}-{s}" for m, s in cases]


# ---------------------------------------------------------------------------------------------
# Pointwise, with broadcasting

UNARY = {
    "exp": torch.exp, "tanh": torch.tanh, "sigmoid": torch.sigmoid, "relu": torch.relu,
    "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu,
    "abs": torch.abs, "neg": torch.neg, "sin": torch.sin, "cos": torch.cos,
    "clamp": lambda x: x.clamp(-0.5, 0.7), "leaky_relu": lambda x: F.leaky_relu(x, 0.1),
    "softplus": F.softplus, "elu": F.elu, "erf": torch.erf, "square": torch.square,
    "sqrt": lambda x: (x.abs() + 1).sqrt(), "rsqrt": lambda x: (x * x + 1).rsqrt(),
    "log1p": lambda x: x.abs().log1p(), "hardtanh": F.hardtanh, "mish": F.mish,
    "hardswish": F.hardswish, "pow3": lambda x: x.pow(3), "scalar_ops": lambda x: (2.5 - x) * 3 / 7,
    "reciprocal": lambda x: (x * x + 1).reciprocal(), "atan": torch.atan,
    "to_float32": lambda x: x.float() * 2, "where_scalar": lambda x: torch.where(x > 0, x, 0.5 * x),
}


@pytest.mark.parametrize("name,mesh_shape,spec", spread(UNARY, mesh_spec_cases(2, 3, salt=1), 4))
def test_unary_pointwise(name, mesh_shape, spec):
    # Elementwise ops run on the shards as they are: no communication, forward or backward.
    check(UNARY[name], [T(10, 6)], [spec], mesh_of(mesh_shape), grad=True, fwd=[], bwd=[])


BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": lambda a, b: a / (b * b + 1),
    "maximum": torch.maximum, "minimum": torch.minimum, "atan2": torch.atan2,
    "pow": lambda a, b: (a * a + 1).pow(b), "hypot": torch.hypot,
    "where": lambda a, b: torch.where(a > b, a, b * 2), "lerp": lambda a, b: torch.lerp(a, b, 0.3),
    "addcmul": lambda a, b: torch.addcmul(a, a, b, value=0.5), "eq_float": lambda a, b: (a > b).to(a.dtype) + a,
    "sub_alpha": lambda a, b: torch.sub(a, b, alpha=2.5), "masked_fill": lambda a, b: a.masked_fill(b > 0, 3.0),
}

# (shape a, shape b): broadcasting on the left, size-1 dims, rank differences.
BROADCAST_SHAPES = [((10, 6), (10, 6)), ((10, 6), (6,)), ((10, 6), (10, 1)), ((3, 1, 5), (4, 5)),
                    ((1, 6), (10, 1)), ((2, 10, 6), (6,))]


def _spec_for(shape, mesh_shape, salt):
    return pick_specs(mesh_shape, len(shape), 6, salt)[salt % len(pick_specs(mesh_shape, len(shape), 6, salt))]


BINARY_CASES = []
for _i, (_sa, _sb) in enumerate(BROADCAST_SHAPES):
    for _m in MESHES:
        for _k in range(2):
            BINARY_CASES.append((_sa, _sb, _m, _spec_for(_sa, _m, _i + _k), _spec_for(_sb, _m, _i * 3 + _k + 1)))


@pytest.mark.parametrize("name,sa,sb,mesh_shape,spec_a,spec_b", spread(BINARY, BINARY_CASES, 14))
def test_binary_pointwise_broadcast(name, sa, sb, mesh_shape, spec_a, spec_b):
    fn = BINARY[name]
    if name == "masked_fill" and len(sb) > len(sa):
        pytest.skip("masked_fill's mask cannot have a higher rank")
    check(fn, [T(*sa), T(*sb, seed=1)], [spec_a, spec_b], mesh_of(mesh_shape), grad=True)


@pytest.mark.parametrize("mesh_shape,spec", mesh_spec_cases(3, 3), ids=ids(mesh_spec_cases(3, 3)))
def test_pointwise_matching_shardings_need_no_communication(mesh_shape, spec):
    # Both operands already laid out alike (the second broadcast on its leading dims): the
    # result takes that layout, nothing moves.
    def f(a, b, c):
        return torch.tanh(a * b + c).sigmoid() - a / (1 + b * b)
    spec_c = spec[1:]
    check(f, [T(3, 10, 6), T(3, 10, 6, seed=1), T(10, 6, seed=2)], [spec, spec, spec_c],
          mesh_of(mesh_shape), grad=True, fwd=[], bwd=only("all-reduce", "reduce-scatter"))


@pytest.mark.parametrize("make", [
    lambda x: x.new_zeros(4, 3) + 1, lambda x: x.new_ones(2, 8), lambda x: x.new_full((5,), 2.0),
], ids=["new_zeros", "new_ones", "new_full"])
def test_new_factories_read_only_the_dtype_of_a_sharded_self(make):
    # new_* takes only dtype and device from self: a sharded self is not gathered for it.
    mesh = mesh_of((4, 2))
    check(make, [T(8, 6)], [("data", "model")], mesh, fwd=[])


def test_pointwise_int_and_bool():
    mesh = mesh_of((4, 2))
    a = torch.arange(60).reshape(10, 6)
    b = torch.arange(6) % 4 + 1
    check(lambda a, b: (a * b + 3) // b % 5 - (a > 20).to(torch.int64), [a, b],
          [("data", "model"), ("model",)], mesh, fwd=[])
    check(lambda a: (a > 10) & (a < 40) | (a == 3), [a], [("model", "data")], mesh, fwd=[])


@pytest.mark.parametrize("spec", [("data", "model"), ("data", None), (None, None), ("model", "data")])
def test_dropout_is_local_and_replicas_draw_alike(spec):
    # Random numbers differ from CPU's: check the mask/scale invariants instead. Dropout runs
    # on the shards (no gather), and devices holding the same tile (replicas over an axis that
    # does not tile the tensor) must hold the same mask, or the value is not one tensor.
    from torch_spmd import _C
    mesh = mesh_of((4, 2))
    x = T(10, 6, positive=True)
    r = run(lambda x: F.dropout(x, 0.5, training=True), [x], [spec], mesh)
    out = r.dev_out[0]
    kept = out != 0
    assert torch.allclose(out[kept], 2 * x[kept])
    assert 0 < kept.sum() < x.numel()
    assert r.fwd == [] and not r.fwd_stats["replicated_fallback_ops"]

    import torch_spmd
    y = F.dropout(torch.ones(8, 6, dtype=torch.float64).to(torch_spmd.device()), 0.5)
    z = F.dropout(constrain_on(y, mesh, spec), 0.5)
    torch_spmd.sync()
    for t in (y, z):
        by_tile = {}
        for _, data, offsets, lengths, _ in _C._local_shards(t):
            key = (tuple(offsets), tuple(lengths))
            if key in by_tile:
                assert torch.equal(by_tile[key], data), "replicas drew different random numbers"
            by_tile[key] = data


def constrain_on(t, mesh, spec):
    import torch_spmd.distributed.spmd as xs
    xs.mark_sharding(t, mesh, spec)
    return t


# ---------------------------------------------------------------------------------------------
# Matmul family


def _axis_choices(mesh_shape):
    return [None] + list(MESH_AXES[mesh_shape])


def _pair_specs(mesh_shape):
    """Every (A spec, B spec) of two rank-2 operands with single axes per dim."""
    ch = _axis_choices(mesh_shape)
    one = [(p, q) for p in ch for q in ch if p is None or p != q]
    return [(a, b) for a in one for b in one]


MM_CASES = [((8,), a, b) for a, b in _pair_specs((8,))] + \
           [((4, 2), a, b) for a, b in _pair_specs((4, 2))] + \
           [((2, 2, 2), a, b) for a, b in _pair_specs((2, 2, 2))][::7]


def all_reduces_over(axes, count):
    """Collective predicate: exactly `count` all-reduces, each over the mesh axes `axes`."""
    want = [("all-reduce", sorted(axes))] * count
    return lambda cs: [(c["kind"], sorted(c["axes"])) for c in cs] == want


def _contraction_expectation(spec_a, spec_b):
    """A [i,k] x B [k,j] moves no operand when k is sharded alike (or not at all) and the i, j, k
    axes are distinct: then the step's only collective is the all-reduce of the partial
    products over k's axes (none when k is unsharded). None: no expectation."""
    i, ka = axes_of(spec_a[0]), axes_of(spec_a[1])
    kb, j = axes_of(spec_b[0]), axes_of(spec_b[1])
    used = i + ka + j
    if ka != kb or len(set(used)) != len(used):
        return None
    return all_reduces_over(ka, count=1 if ka else 0)


@pytest.mark.parametrize("mesh_shape,spec_a,spec_b", MM_CASES)
def test_mm_every_operand_sharding(mesh_shape, spec_a, spec_b):
    # 10 x 6 @ 6 x 5: every dim uneven over 4-way axes, 10 and 6 uneven over 8.
    fwd = _contraction_expectation(spec_a, spec_b)
    check(torch.mm, [T(10, 6), T(6, 5, seed=1)], [spec_a, spec_b], mesh_of(mesh_shape),
          grad=True, fwd=fwd)


@pytest.mark.parametrize("mesh_shape,spec_a,spec_b", MM_CASES[::3])
def test_addmm(mesh_shape, spec_a, spec_b):
    bias_spec = (spec_b[1],)
    check(lambda b, x, w: torch.addmm(b, x, w, beta=0.5, alpha=1.5), [T(5), T(10, 6), T(6, 5, seed=1)],
          [bias_spec, spec_a, spec_b], mesh_of(mesh_shape), grad=True)
    # 2-D bias and the default scales.
    check(torch.addmm, [T(10, 5, seed=3), T(10, 6), T(6, 5, seed=1)],
          [dedupe((spec_a[0], spec_b[1])), spec_a, spec_b], mesh_of(mesh_shape), grad=True)


def _bmm_specs(mesh_shape, n, salt):
    return pick_specs(mesh_shape, 3, n, salt)


BMM_CASES = [(m, a, b) for m in MESHES for a in _bmm_specs(m, 5, 0) for b in _bmm_specs(m, 4, 3)]


@pytest.mark.parametrize("mesh_shape,spec_a,spec_b", BMM_CASES)
def test_bmm(mesh_shape, spec_a, spec_b):
    check(torch.bmm, [T(3, 10, 6), T(3, 6, 5, seed=1)], [spec_a, spec_b], mesh_of(mesh_shape),
          grad=True)


@pytest.mark.parametrize("mesh_shape,spec_a,spec_b", BMM_CASES[::2])
def test_baddbmm(mesh_shape, spec_a, spec_b):
    check(lambda c, a, b: torch.baddbmm(c, a, b, beta=0.25, alpha=2.0),
          [T(3, 10, 5, seed=2), T(3, 10, 6), T(3, 6, 5, seed=1)],
          [dedupe((spec_a[0], spec_a[1], spec_b[2])), spec_a, spec_b], mesh_of(mesh_shape), grad=True)
    check(torch.baddbmm, [T(5, seed=2), T(3, 10, 6), T(3, 6, 5, seed=1)],
          [None, spec_a, spec_b], mesh_of(mesh_shape), grad=True)


def test_bmm_batch_sharded_alike_moves_no_operand():
    # Batch on 'a', rows on 'b', the contraction on 'c': the only collective is the all-reduce
    # of the partial products over 'c', inside the step.
    mesh = mesh_of((2, 2, 2))
    check(torch.bmm, [T(4, 10, 6), T(4, 6, 5)], [("a", "b", "c"), ("a", "c", None)], mesh,
          grad=True, fwd=[("all-reduce", ("c",))])


@pytest.mark.parametrize("mesh_shape", MESHES)
def test_matmul_linear_einsum(mesh_shape):
    mesh = mesh_of(mesh_shape)
    ax = MESH_AXES[mesh_shape]
    x_spec = (ax[0], None, ax[-1] if len(ax) > 1 else None)
    check(lambda x, w, b: F.linear(x, w, b), [T(4, 5, 6), T(7, 6), T(7)], [x_spec, (ax[-1], None), None],
          mesh, grad=True)
    check(lambda x, w: torch.matmul(x, w), [T(2, 5, 6), T(6, 3)], [x_spec, None], mesh, grad=True)
    check(lambda x, y: torch.einsum("bij,bjk->bik", x, y), [T(2, 5, 6), T(2, 6, 3)],
          [x_spec, dedupe((ax[0], ax[-1], None))], mesh, grad=True)
    check(lambda x, y: torch.mv(x, y), [T(10, 6), T(6)], [dedupe((ax[0], ax[-1])), (ax[-1],)], mesh,
          grad=True, fallback_ok=True)


# ---------------------------------------------------------------------------------------------
# Reductions

REDUCTIONS = {
    "sum0": lambda x: x.sum(0), "sum1_keep": lambda x: x.sum(1, keepdim=True),
    "sum_all": lambda x: x.sum(), "sum_01": lambda x: x.sum((0, 1)), "sum_neg": lambda x: x.sum(-1),
    "mean0": lambda x: x.mean(0), "mean_all": lambda x: x.mean(), "mean_keep": lambda x: x.mean((0, 2), keepdim=True),
    "amax0": lambda x: x.amax(0), "amax_12": lambda x: x.amax((1, 2)), "amin_keep": lambda x: x.amin(1, keepdim=True),
    "max_all": lambda x: x.max(), "min_all": lambda x: x.min(),
    "max_dim": lambda x: x.max(1), "min_dim_keep": lambda x: x.min(0, keepdim=True),
    "argmax": lambda x: x.argmax(1), "argmin_keep": lambda x: x.argmin(0, keepdim=True),
    "argmax_all": lambda x: x.argmax(),
    "var": lambda x: x.var(0), "var_biased": lambda x: x.var(1, unbiased=False),
    "std": lambda x: x.std(2), "std_keep": lambda x: x.std((0, 1), keepdim=True),
    "var_mean": lambda x: torch.var_mean(x, 1), "norm2": lambda x: x.norm(dim=1),
    "norm_all": lambda x: x.norm(), "norm1": lambda x: x.norm(p=1, dim=0),
    "logsumexp": lambda x: x.logsumexp(1), "logsumexp_keep": lambda x: x.logsumexp(0, keepdim=True),
    "prod": lambda x: (x * 0.1 + 1).prod(2), "cumsum": lambda x: x.cumsum(1),
    "nansum": lambda x: x.nansum(0), "any": lambda x: (x > 1).any(1), "all": lambda x: (x > -2).all(0),
}
# Sums and extrema combine partial results: sharding the reduced dim costs one all-reduce of
# the (small) result, in the step (no partial sum leaves a step), and no gather.
FREE_REDUCTIONS = {"sum0", "sum1_keep", "sum_all", "sum_01", "sum_neg", "mean0", "mean_all",
                   "mean_keep", "amax0", "amax_12", "amin_keep", "max_all", "min_all", "nansum"}
NO_GRAD = {"argmax", "argmin_keep", "argmax_all", "any", "all"}

RED_CASES = mesh_spec_cases(3, 4, salt=2)


@pytest.mark.parametrize("name,mesh_shape,spec", spread(REDUCTIONS, RED_CASES, 7))
def test_reduction(name, mesh_shape, spec):
    # [5, 10, 6]: 5 and 10 uneven over 2/4/8-way axes, 6 uneven over 4 and 8.
    x = T(5, 10, 6)
    if name.startswith(("max", "min", "amax", "amin", "argm")):
        x = torch.randperm(300).reshape(5, 10, 6).to(torch.float64)  # unique values: no ties
    fwd = one_reduction if name in FREE_REDUCTIONS else only("all-gather", "all-to-all")
    check(REDUCTIONS[name], [x], [spec], mesh_of(mesh_shape), grad=name not in NO_GRAD, fwd=fwd)


def one_reduction(cs) -> bool:
    """At most one collective, an all-reduce: partial results combined once."""
    return len(cs) <= 1 and all(c["kind"] == "all-reduce" for c in cs)


def test_sum_of_uneven_shards_masks_padding():
    # 10 rows over 4 devices: shards of 3, the last holds 1 row and 2 rows of NaN padding.
    mesh = mesh_of((4, 2))
    r = check(lambda x: x.sum(0), [T(10, 6)], [("data", None)], mesh,
              fwd=[("all-reduce", ("data",))])
    assert not torch.isnan(r.dev_out[0]).any()


# ---------------------------------------------------------------------------------------------
# Softmax family

SOFTMAX_CASES = mesh_spec_cases(3, 4, salt=5)


@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("mesh_shape,spec", SOFTMAX_CASES, ids=ids(SOFTMAX_CASES))
def test_softmax_and_backward(dim, log, mesh_shape, spec):
    fn = (lambda x: x.log_softmax(dim)) if log else (lambda x: x.softmax(dim))
    d = dim % 3
    free = spec[d] is None
    check(fn, [T(5, 10, 6)], [spec], mesh_of(mesh_shape), grad=True,
          fwd=[] if free else only("all-gather", "all-to-all"), bwd=[] if free else None)


@pytest.mark.skipif(not hasattr(torch.ops.aten, "_safe_softmax"), reason="torch < 2.5")
def test_safe_softmax_keeps_rows_sharded():
    """scaled_dot_product_attention's math path: its rows stay sharded (no all-gather of the
    scores), fully masked rows give zeros as on CPU."""
    x = T(6, 4, 10)
    x[1, 2] = float("-inf")
    check(lambda x: torch.ops.aten._safe_softmax(x, -1), [x], [("data", "model", None)],
          mesh_of((4, 2)), fwd=[])


def test_softmax_backward_data_directly():
    mesh = mesh_of((4, 2))
    y = T(10, 6).softmax(1)
    g = T(10, 6, seed=3)
    check(lambda g, y: torch.ops.aten._softmax_backward_data(g, y, 1, torch.float64), [g, y],
          [("data", "model"), ("data", None)], mesh)
    check(lambda g, y: torch.ops.aten._log_softmax_backward_data(g, y.log(), 0, torch.float64),
          [g, y], [("model", "data"), ("data", None)], mesh)


# ---------------------------------------------------------------------------------------------
# Normalization

LN_CASES = mesh_spec_cases(3, 4, salt=7)


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("mesh_shape,spec", LN_CASES, ids=ids(LN_CASES))
def test_layer_norm_and_backward(affine, mesh_shape, spec):
    mesh = mesh_of(mesh_shape)
    w_spec = (spec[2],)
    if affine:
        fn = lambda x, w, b: F.layer_norm(x, (6,), w, b, eps=1e-5)  # noqa: E731
        inputs, specs = [T(5, 10, 6), T(6, seed=1), T(6, seed=2)], [spec, w_spec, None]
    else:
        fn = lambda x: F.layer_norm(x, (6,))  # noqa: E731
        inputs, specs = [T(5, 10, 6)], [spec]
    free = spec[2] is None
    # Batch dims pass through; the weight/bias gradients sum over them: all-reduced in the
    # backward step when the batch dims are sharded.
    batch_axes = tuple(a for d in spec[:2] for a in axes_of(d))
    bwd = all_reduces_over(batch_axes, count=2 if affine and batch_axes else 0)
    check(fn, inputs, specs, mesh, grad=True,
          fwd=[] if free and (not affine or w_spec == (None,)) else None,
          bwd=bwd if free and (not affine or w_spec == (None,)) else None)
    # Two normalized dims.
    check(lambda x: F.layer_norm(x, (10, 6)), [T(5, 10, 6)], [spec], mesh, grad=True)


BN_CASES = mesh_spec_cases(4, 3, salt=11)


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("mesh_shape,spec", BN_CASES, ids=ids(BN_CASES))
def test_batch_norm_and_backward(training, mesh_shape, spec):
    mesh = mesh_of(mesh_shape)
    x = T(5, 6, 3, 2)
    w, b = T(6, seed=1), T(6, seed=2)
    rm, rv = T(6, seed=3), T(6, seed=4, positive=True)
    c_spec = (spec[1],)

    def fn(x, w, b, rm, rv):
        return F.batch_norm(x, rm, rv, w, b, training=training, momentum=0.3, eps=1e-5)

    check(fn, [x, w, b, rm, rv], [spec, c_spec, c_spec, c_spec, None], mesh, grad=[0, 1, 2])
    if not training:
        # Eval is per-channel elementwise: no data moves when the channels are the only tiled
        # dim of the input and the parameters follow them.
        check(fn, [x, w, b, rm, rv], [(None, spec[1], None, None), c_spec, c_spec, c_spec, c_spec],
              mesh, grad=[0, 1, 2], fwd=[], bwd=[])


def test_batch_norm_updates_running_stats():
    mesh = mesh_of((4, 2))

    def fn(x, rm, rv):
        rm, rv = rm.clone(), rv.clone()
        y = F.batch_norm(x, rm, rv, training=True, momentum=0.2)
        return y, rm, rv
    check(fn, [T(10, 6, 3), T(6), T(6, positive=True)], [("data", "model", None), ("model",), None],
          mesh, grad=[0])


# ---------------------------------------------------------------------------------------------
# Embedding

EMB_CASES = [((8,), ("x", None), ("x",)), ((8,), (None, "x"), (None,)), ((4, 2), ("data", "model"), ("data",)),
             ((4, 2), (None, "model"), ("model",)), ((4, 2), ("model", None), (("data", "model"),)),
             ((2, 2, 2), ("a", ("b", "c")), ("c",)), ((2, 2, 2), (None, "a"), (("b", "c"),))]


@pytest.mark.parametrize("mesh_shape,w_spec,i_spec", EMB_CASES)
def test_embedding_and_backward(mesh_shape, w_spec, i_spec):
    mesh = mesh_of(mesh_shape)
    idx = torch.tensor([3, 0, 9, 3, 7, 1, 1, 4, 9, 2, 5])  # 11 indices: uneven everywhere
    check(lambda w, i: F.embedding(i, w), [T(10, 6), idx], [w_spec, i_spec], mesh, grad=[0])
    check(lambda w, i: F.embedding(i, w, padding_idx=3), [T(10, 6), idx], [w_spec, i_spec], mesh,
          grad=[0])
    idx2 = idx[:10].reshape(2, 5)
    check(lambda w, i: F.embedding(i, w, scale_grad_by_freq=True), [T(10, 6), idx2],
          [w_spec, (i_spec[0], None)], mesh, grad=[0])


def test_embedding_with_sharded_indices_is_free():
    # Rows of the lookup follow the indices; the table's embedding dim follows its sharding.
    # The table's gradient sums the rows of every index shard: one all-reduce over 'data'.
    mesh = mesh_of((4, 2))
    idx = torch.tensor([[3, 0, 9], [3, 7, 1], [1, 4, 9], [2, 5, 0]])
    check(lambda w, i: F.embedding(i, w), [T(10, 6), idx], [(None, "model"), ("data", None)], mesh,
          grad=[0], fwd=[], bwd=[("all-reduce", ("data",))])


# ---------------------------------------------------------------------------------------------
# Losses

LOSS_CASES = [((8,), ("x", None)), ((4, 2), ("data", None)), ((4, 2), ("data", "model")),
              ((4, 2), (("data", "model"), None)), ((4, 2), (None, "model")), ((2, 2, 2), (("a", "c"), "b")),
              ((2, 2, 2), (None, None))]


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("mesh_shape,spec", LOSS_CASES)
def test_nll_loss(reduction, mesh_shape, spec):
    mesh = mesh_of(mesh_shape)
    logp = T(10, 5).log_softmax(1)
    target = torch.tensor([0, 4, 2, 2, 1, 3, 0, 4, 1, 1])
    t_spec = (spec[0],)
    check(lambda x, t: F.nll_loss(x, t, reduction=reduction), [logp, target], [spec, t_spec], mesh,
          grad=[0])
    # ignore_index (also a class that occurs) and class weights.
    target2 = torch.tensor([0, 4, -100, 2, 1, 3, -100, 4, 1, 1])
    check(lambda x, t: F.nll_loss(x, t, reduction=reduction), [logp, target2], [spec, t_spec], mesh,
          grad=[0])
    w = T(5, positive=True)
    check(lambda x, t, w: F.nll_loss(x, t, weight=w, ignore_index=2, reduction=reduction),
          [logp, target, w], [spec, t_spec, None], mesh, grad=[0])


@pytest.mark.parametrize("mesh_shape,spec", LOSS_CASES)
def test_cross_entropy(mesh_shape, spec):
    mesh = mesh_of(mesh_shape)
    target = torch.tensor([0, 4, 2, 2, 1, 3, 0, 4, 1, 1])
    check(lambda x, t: F.cross_entropy(x, t), [T(10, 5), target], [spec, (spec[0],)], mesh, grad=[0])
    # Label smoothing's ignore mask goes through index_put/masked_scatter, which have no rule.
    check(lambda x, t: F.cross_entropy(x, t, label_smoothing=0.1), [T(10, 5), target],
          [spec, (spec[0],)], mesh, grad=[0], fallback_ok=True)


ELEMENTWISE_LOSSES = {
    "mse": F.mse_loss, "l1": F.l1_loss, "smooth_l1": lambda a, b, reduction: F.smooth_l1_loss(a, b, reduction=reduction, beta=0.5),
    "huber": lambda a, b, reduction: F.huber_loss(a, b, reduction=reduction, delta=0.7),
    "bce": lambda a, b, reduction: F.binary_cross_entropy(a.sigmoid(), b.sigmoid(), reduction=reduction),
    "soft_margin": lambda a, b, reduction: F.soft_margin_loss(a, b.sign(), reduction=reduction),
    "bce_logits": lambda a, b, reduction: F.binary_cross_entropy_with_logits(a, b.sigmoid(), reduction=reduction),
    "kl_div": lambda a, b, reduction: F.kl_div(a.log_softmax(-1), b.softmax(-1), reduction=reduction),
}


@pytest.mark.parametrize("name", sorted(ELEMENTWISE_LOSSES))
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("mesh_shape,spec", LOSS_CASES[:6])
def test_elementwise_losses(name, reduction, mesh_shape, spec):
    fn = ELEMENTWISE_LOSSES[name]
    check(lambda a, b: fn(a, b, reduction=reduction), [T(10, 6), T(10, 6, seed=1)], [spec, spec],
          mesh_of(mesh_shape), grad=[0])


def test_mse_loss_sharded_alike_needs_one_all_reduce():
    # The elementwise part needs no communication; the loss sums every shard: one all-reduce of
    # a scalar. Its gradient is elementwise again.
    mesh = mesh_of((4, 2))
    for reduction in ["mean", "sum"]:
        check(lambda a, b: F.mse_loss(a, b, reduction=reduction), [T(10, 6), T(10, 6, seed=1)],
              [("data", "model"), ("data", "model")], mesh, grad=[0],
              fwd=[("all-reduce", ("data", "model"))], bwd=[])


# ---------------------------------------------------------------------------------------------
# Views and data movement

VIEW_CASES = mesh_spec_cases(3, 5, salt=13)

VIEWS = {
    "view_merge_01": lambda x: x.reshape(40, 6), "view_merge_12": lambda x: x.reshape(4, 60),
    "view_split_1": lambda x: x.reshape(4, 5, 2, 6), "view_split_2": lambda x: x.reshape(4, 10, 3, 2),
    "view_all": lambda x: x.reshape(-1), "view_regroup": lambda x: x.reshape(8, 30),
    "view_unflatten": lambda x: x.flatten(1).reshape(4, 3, 20),
    "permute": lambda x: x.permute(2, 0, 1), "transpose": lambda x: x.transpose(0, 2),
    "t_of_2d": lambda x: x[0].t(), "contiguous_t": lambda x: x.transpose(1, 2).contiguous().view(4, 60),
    "expand": lambda x: x[:, :1].expand(4, 7, 6), "expand_new": lambda x: x[0].expand(3, 10, 6),
    "unsqueeze": lambda x: x.unsqueeze(1), "squeeze": lambda x: x[:, :1].squeeze(1),
    "unsqueeze_squeeze": lambda x: x.unsqueeze(-1).squeeze(-1) * 2,
    "slice1": lambda x: x[:, 2:9], "slice_step": lambda x: x[:, 1::3], "slice2": lambda x: x[..., 1:4],
    "narrow": lambda x: x.narrow(0, 1, 2), "select": lambda x: x[:, 3], "select_last": lambda x: x[..., -1],
    "cat1": lambda x: torch.cat([x, x * 2], 1), "cat0": lambda x: torch.cat([x[:2], x, x[1:]], 0),
    "cat2": lambda x: torch.cat([x[..., :2], x.exp()], 2), "stack0": lambda x: torch.stack([x, -x]),
    "stack2": lambda x: torch.stack([x, x * x], 2), "split": lambda x: x.split(4, 1),
    "chunk": lambda x: x.chunk(3, 2), "unbind": lambda x: x.unbind(0),
    "flip": lambda x: x.flip(1), "roll": lambda x: x.roll(2, 1), "tril": lambda x: x.tril(),
    "pad": lambda x: F.pad(x, (1, 2, 0, 1)), "repeat": lambda x: x.repeat(1, 2, 1),
    "sort": lambda x: x.sort(1).values, "topk": lambda x: x.topk(3, dim=2).values,
    "cumsum": lambda x: x.cumsum(2),
}


@pytest.mark.parametrize("name,mesh_shape,spec", spread(VIEWS, VIEW_CASES, 7))
def test_view_and_movement_ops(name, mesh_shape, spec):
    fn = VIEWS[name]
    check(fn, [T(4, 10, 6)], [spec], mesh_of(mesh_shape), grad=True)


@pytest.mark.parametrize("mesh_shape", MESHES)
def test_views_that_keep_the_tiling_are_free(mesh_shape):
    mesh = mesh_of(mesh_shape)
    a = MESH_AXES[mesh_shape]
    # Merging [8, 5, 6] dims 0,1 with only dim 0 sharded evenly; splitting a dim whose major
    # factor takes the axes; permutes and transposes carry the tiling with them.
    check(lambda x: x.reshape(40, 6) * 2, [T(8, 5, 6)], [(a[0], None, None)], mesh, grad=True, fwd=[], bwd=[])
    check(lambda x: x.reshape(8, 2, 3) + 1, [T(8, 6)], [(a[0], None)], mesh, grad=True, fwd=[], bwd=[])
    check(lambda x: x.permute(2, 0, 1).transpose(0, 1), [T(8, 5, 6)], [(a[0], None, a[-1] if len(a) > 1 else None)],
          mesh, grad=True, fwd=[], bwd=[])
    check(lambda x: x.unsqueeze(0).expand(3, 8, 6), [T(8, 6)], [(a[0], None)], mesh, grad=True, fwd=[])


def test_cat_onto_empty_tensors_keeps_the_joined_dim_sharded():
    # A KV cache's first update, torch.cat([past, k], -2) with an empty past, is k itself: the
    # sequence dim stays sharded (uneven: 13 rows over 8, padding poisoned), nothing gathered.
    mesh = mesh_of((8,))
    check(lambda x: torch.cat([x.new_zeros(4, 0, 6), x, x.new_empty(0)], 1) * 2, [T(4, 13, 6)],
          [(None, "x", None)], mesh, grad=True, fwd=[], bwd=[])


# Indexing by tensors

INDEX_CASES = mesh_spec_cases(2, 4, salt=17)


@pytest.mark.parametrize("mesh_shape,spec", INDEX_CASES, ids=ids(INDEX_CASES))
def test_index_select(mesh_shape, spec):
    mesh = mesh_of(mesh_shape)
    idx = torch.tensor([5, 0, 9, 9, 2, 7, 1])
    check(lambda x, i: x.index_select(0, i), [T(10, 6), idx], [spec, (spec[0],)], mesh, grad=[0])
    check(lambda x, i: x.index_select(1, i % 6), [T(10, 6), idx], [spec, (spec[1],)], mesh, grad=[0])


@pytest.mark.parametrize("mesh_shape,spec", INDEX_CASES, ids=ids(INDEX_CASES))
def test_gather_scatter(mesh_shape, spec):
    mesh = mesh_of(mesh_shape)
    g = torch.Generator().manual_seed(3)
    idx1 = torch.randint(0, 6, (10, 4), generator=g)
    idx0 = torch.randint(0, 10, (7, 6), generator=g)
    check(lambda x, i: x.gather(1, i), [T(10, 6), idx1], [spec, (spec[0], None)], mesh, grad=[0])
    check(lambda x, i: x.gather(0, i), [T(10, 6), idx0], [spec, (None, spec[1])], mesh, grad=[0])
    src = T(10, 4, seed=5)
    uniq = torch.stack([torch.randperm(6, generator=g)[:4] for _ in range(10)])  # no duplicates per row
    check(lambda x, i, s: x.scatter(1, i, s), [T(10, 6), uniq, src], [spec, (spec[0], None), spec],
          mesh, grad=[0, 2])
    check(lambda x, i, s: x.scatter_add(1, i, s), [T(10, 6), idx1, src], [spec, spec, (spec[0], None)],
          mesh, grad=[0, 2])
    check(lambda x, i: x.scatter(0, i, 2.5), [T(10, 6), idx0], [spec, None], mesh, grad=[0])
    check(lambda x, i, s: x.index_add(0, i, s), [T(10, 6), torch.tensor([1, 9, 1, 3]), T(4, 6, seed=6)],
          [spec, None, (None, spec[1])], mesh, grad=[0, 2])


@pytest.mark.parametrize("mesh_shape,spec", INDEX_CASES, ids=ids(INDEX_CASES))
def test_index_put_and_advanced_indexing(mesh_shape, spec):
    # index.Tensor and index_put have rules (advanced_index.cc): no replicated fallback but
    # for boolean masks (data-dependent shapes).
    mesh = mesh_of(mesh_shape)
    rows = torch.tensor([0, 9, 4])
    cols = torch.tensor([1, 5, 2])

    def put(x, v, r, c):
        y = x.clone()
        y[r, c] = v
        return y

    check(put, [T(10, 6), T(3), rows, cols], [spec, None, None, None], mesh, grad=[0, 1])

    def acc(x, v, r):
        return x.index_put((r,), v, accumulate=True)

    check(acc, [T(10, 6), T(3, 6), torch.tensor([0, 9, 0])], [spec, (None, spec[1])], mesh,
          grad=[0, 1])
    check(lambda x, r: x[r] * 2, [T(10, 6), rows], [spec, (spec[0],)], mesh, grad=[0])
    check(lambda x: x[x > 0.5], [T(10, 6)], [spec], mesh, grad=True, fallback_ok=True)
    check(lambda x: x.masked_fill(x > 0.3, -1.0), [T(10, 6)], [spec], mesh, grad=True, fwd=[])


@pytest.mark.parametrize("mesh_shape,spec", INDEX_CASES, ids=ids(INDEX_CASES))
def test_advanced_indexing_keeps_the_index_dims_sharded(mesh_shape, spec):
    # A Mixture-of-Experts layer's weights[expert_ids] (ids sharded with the tokens), indices
    # that broadcast (Hugging Face's mask code: x[batch[:, None, None, None], pos[None, None,
    # None, :]]) and indices that are not adjacent (the broadcast dims go in front).
    mesh = mesh_of(mesh_shape)
    g = torch.Generator().manual_seed(11)
    ids_ = torch.randint(0, 4, (10,), generator=g)
    check(lambda w, i: w[i] * 2, [T(4, 6, 3), ids_], [(None, spec[1], None), (spec[0],)], mesh,
          grad=[0], fwd=[])
    batch = torch.arange(10).view(10, 1, 1, 1)
    pos = torch.tensor([5, 0, 3, 1, 2, 4]).view(1, 1, 1, 6)
    check(lambda m, b, p: m[b, p], [T(10, 6), batch, pos], [spec, (spec[0], None, None, None), None],
          mesh, grad=[0])
    check(lambda x, r, c: x[r, :, c] + 1, [T(10, 5, 6), torch.tensor([9, 0, 4]), torch.tensor([5, 1, 2])],
          [(spec[0], spec[1], None), None, None], mesh, grad=[0])


@pytest.mark.parametrize("mesh_shape,spec", INDEX_CASES, ids=ids(INDEX_CASES))
def test_index_put_accumulate_sums_on_the_devices_that_hold_the_values(mesh_shape, spec):
    # The backward of weights[expert_ids]: each device adds its tokens' gradients into the
    # rows of their experts, leaving a partial sum that is reduced once (self, nonzero here, is
    # counted once), instead of every token's gradient being gathered.
    mesh = mesh_of(mesh_shape)
    g = torch.Generator().manual_seed(12)
    ids_ = torch.randint(0, 4, (10,), generator=g)

    def acc(x, v, i):
        return constrain(x.index_put((i,), v, accumulate=True), (None, None))

    sums_once = (lambda cs: not cs) if spec[0] is None else \
        (lambda cs: cs and all(c["kind"] == "all-reduce" for c in cs))
    check(acc, [T(4, 6), T(10, 6, seed=3), ids_], [None, (spec[0], None), (spec[0],)], mesh,
          grad=[0, 1], fwd=sums_once)


def _setitem_program(x, v):
    y = x * 1
    y[:, 1:3] = v
    y[2] = 0.5
    y[..., -1] += 1
    return y


def test_setitem_through_views():
    mesh = mesh_of((4, 2))
    check(_setitem_program, [T(10, 6), T(10, 2)], [("data", "model"), ("data", None)], mesh)


@pytest.mark.parametrize("specs", [[None, None], [("data", "model"), ("data", None)],
                                   [("model", None), (None, "data")]])
def test_setitem_through_views_backward(specs):
    # Autograd's CopySlices replays the view with as_strided on the gradient (fallback ops).
    mesh = mesh_of((4, 2))
    check(_setitem_program, [T(10, 6), T(10, 2)], specs, mesh, grad=True, fallback_ok=True)


# ---------------------------------------------------------------------------------------------
# Optimizer in-place updates on sharded parameters


def _train(opt_factory, device_run, mesh, specs, steps=3):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.Tanh(), torch.nn.Linear(10, 3))
    xs_ = [T(7, 6, seed=s) for s in range(steps)]
    if device_run:
        import torch_spmd
        import torch_spmd.distributed.spmd as xs
        model = model.to(torch.float64).to(torch_spmd.device())
        for p, spec in zip(model.parameters(), specs):
            if spec is not None:
                xs.mark_sharding(p, mesh, spec)
    else:
        model = model.to(torch.float64)
    opt = opt_factory(model.parameters())
    losses = []
    for x in xs_:
        if device_run:
            import torch_spmd
            x = x.to(torch_spmd.device())
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        if device_run:
            torch_spmd.sync()
        losses.append(loss.detach().cpu())
    params = [p.detach().cpu() for p in model.parameters()]
    state = []
    for p in model.parameters():
        for k, v in sorted(opt.state[p].items()):
            if isinstance(v, torch.Tensor):
                state.append(v.detach().cpu())
    return losses, params, state


OPTIMIZERS = {
    "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01),
    "sgd_plain": lambda ps: torch.optim.SGD(ps, lr=0.05),
    "adam": lambda ps: torch.optim.Adam(ps, lr=0.01, weight_decay=0.01),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=0.01, amsgrad=True),
    "rmsprop": lambda ps: torch.optim.RMSprop(ps, lr=0.01, momentum=0.5),
    "adagrad": lambda ps: torch.optim.Adagrad(ps, lr=0.1),
    # torch 2.x paths: the foreach (_foreach_*) kernels are the default on the spmd device;
    # the per-tensor loop, the fused kernels and capturable (step counts on the device) too.
    "adam_loop": lambda ps: torch.optim.Adam(ps, lr=0.01, foreach=False),
    "adam_fused": lambda ps: torch.optim.Adam(ps, lr=0.01, weight_decay=0.01, fused=True),
    "adamw_fused": lambda ps: torch.optim.AdamW(ps, lr=0.01, amsgrad=True, fused=True),
    # (capturable needs an accelerator: the CPU reference runs the same math uncaptured)
    "adam_capturable": lambda ps: (lambda ps: torch.optim.Adam(
        ps, lr=0.01, capturable=ps[0].device.type == "spmd"))(list(ps)),
    "sgd_fused": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, fused=True),
    "adagrad_fused": lambda ps: torch.optim.Adagrad(ps, lr=0.1, fused=True),
}
# capturable keeps the step count and bias corrections as float32 device tensors, so it agrees
# with the uncaptured CPU reference to float32 precision only.
OPTIMIZER_TOLERANCE = {"adam_capturable": dict(rtol=1e-4, atol=1e-7)}
PARAM_SPECS = {
    (8,): [("x", None), ("x",), (None, "x"), None],
    (4, 2): [("model", "data"), ("model",), (("data", "model"), None), ("data",)],
    (2, 2, 2): [(("a", "b"), "c"), None, ("c", ("a", "b")), ("b",)],
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("mesh_shape", MESHES)
def test_optimizer_updates_on_sharded_params(name, mesh_shape):
    ensure_devices()
    mesh = mesh_of(mesh_shape)
    specs = PARAM_SPECS[mesh_shape]
    ref = _train(OPTIMIZERS[name], False, None, specs)
    got = _train(OPTIMIZERS[name], True, mesh, specs)
    tol = OPTIMIZER_TOLERANCE.get(name, dict(rtol=1e-9, atol=1e-9))
    for what, a, b in zip(["losses", "params", "state"], got, ref):
        assert len(a) == len(b)
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{what} {i}", **tol)


# ---------------------------------------------------------------------------------------------
# Regressions for partitioner and runtime bugs found by this suite


def test_addmm_integer_contraction():
    # Integer results cannot carry the bias as bias/n partial sums: reduced before the add.
    mesh = mesh_of((4, 2))
    g = torch.Generator().manual_seed(0)
    b = torch.randint(-5, 5, (5,), generator=g)
    x = torch.randint(-5, 5, (10, 6), generator=g)
    w = torch.randint(-5, 5, (6, 5), generator=g)
    check(lambda b, x, w: torch.addmm(b, x, w, beta=2, alpha=3), [b, x, w],
          [None, (None, "model"), ("model", None)], mesh)


def test_addmm_with_sharded_contraction_stays_partial():
    # addmm over a sharded contraction leaves its result pending (bias added as bias/n on every
    # member), so a sharded consumer gets a reduce-scatter instead of all-reduce + slice.
    mesh = mesh_of((8,), names=("model",))

    def f(b, x, w):
        return constrain(torch.addmm(b, x, w, beta=0.5), ("model", None)).relu()

    # The operands are larger than the result: the contraction keeps 'model'.
    r = check(f, [T(8), T(16, 32), T(32, 8)], [None, (None, "model"), ("model", None)], mesh,
              grad=True)
    assert r.fwd == [("reduce-scatter", ("model",))]


def test_non_contiguous_kernel_results_feed_strided_ops():
    # transpose_copy/permute_copy return strided CPU tensors; ops with explicit strides
    # (_reshape_alias_copy from matmul's reshape) must see the contiguous layout the lazy tensor
    # reports.
    for mesh_shape, spec in [((8,), None), ((8,), ("x", None, None)), ((4, 2), (None, "model", "data"))]:
        mesh = mesh_of(mesh_shape)
        check(lambda x: torch.matmul(x, x.transpose(-1, -2)), [T(3, 2, 4)], [spec], mesh, grad=True)
        check(lambda x: x.permute(2, 0, 1).reshape(4, 6).sum(1), [T(3, 2, 4)], [spec], mesh, grad=True)
        check(lambda x: torch.matmul(x.permute(0, 2, 1), x), [T(3, 2, 4)], [spec], mesh, grad=True)


def test_non_contiguous_host_tensor_upload():
    mesh = mesh_of((4, 2))
    x = T(6, 10).t()  # a strided host view
    check(lambda x: torch.matmul(x, x.t()) + x.sum(1), [x], [("data", "model")], mesh, grad=True)
    check(lambda x: torch.matmul(x, x.t()), [x], [None], mesh, grad=True)


@pytest.mark.parametrize("mesh_shape,spec", [((4, 2), ("data", None)), ((2, 2, 2), (("a", "b"), "c")),
                                             ((8,), ("x", None))])
def test_partial_sums_pass_through_linear_ops(mesh_shape, spec):
    # A sum over a sharded dim stays a pending partial through views, transposes, slices,
    # negation and scaling, and is exact wherever it is finally reduced.
    mesh = mesh_of(mesh_shape)

    def f(x):
        s = x.sum(0)                     # partial over the axes of dim 0
        t = (-s.t()[1:]).reshape(-1) * 0.5
        return t, t.sum(), s.cumsum(1)
    r = check(f, [T(10, 3, 4)], [spec + (None,)], mesh, grad=True)
    # s is reduced at most once (shared by its two readers); nothing else is reduced.
    assert sum(k in ("all-reduce", "reduce-scatter") for k, _ in r.fwd) <= 1, r.fwd


def test_megatron_bias_dynamic_optimizer_scalars_recompile_free():
    # The same compiled program must serve steps whose optimizer scalars (lr) change.
    import torch_spmd
    from torch_spmd.debug import metrics
    mesh = mesh_of((4, 2))
    torch.manual_seed(0)
    cpu = torch.nn.Linear(6, 4).double()
    import copy
    model = copy.deepcopy(cpu).to(torch_spmd.device())
    import torch_spmd.distributed.spmd as xs
    xs.mark_sharding(model.weight, mesh, ("model", "data"))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt_cpu = torch.optim.SGD(cpu.parameters(), lr=0.1)
    x = T(8, 6)
    xd = x.to(torch_spmd.device())
    compiles = []
    for lr in [0.1, 0.05, 0.2]:
        for o in (opt, opt_cpu):
            o.param_groups[0]["lr"] = lr
        opt.zero_grad()
        model(xd).pow(2).mean().backward()
        opt.step()
        torch_spmd.sync()
        compiles.append(metrics.counter_value("UncachedCompile"))
        opt_cpu.zero_grad()
        cpu(x).pow(2).mean().backward()
        opt_cpu.step()
    assert compiles[2] == compiles[1], compiles  # steps 2 and 3 differ only in lr
    for p, q in zip(model.parameters(), cpu.parameters()):
        assert_same(p.detach().cpu(), q.detach(), "param")


@pytest.mark.parametrize("name", ["sgd_momentum", "adam", "adamw", "rmsprop", "adagrad",
                                  "adam_loop", "adam_fused", "adamw_fused", "adam_capturable",
                                  "sgd_fused", "adagrad_fused"])
@pytest.mark.parametrize("mesh_shape,spec", [((8,), ("x", None)), ((4, 2), ("model", "data")),
                                             ((2, 2, 2), (("a", "c"), None))])
def test_optimizer_update_is_local(name, mesh_shape, spec):
    # Parameters and gradients sharded alike: every optimizer update is elementwise on the
    # shards: no collective, no fallback, in every step (state created on the first).
    import torch_spmd
    from spmd_diff import step, to_device
    mesh = mesh_of(mesh_shape)
    p_cpu = torch.nn.Parameter(T(10, 6))
    p_dev = torch.nn.Parameter(to_device(T(10, 6), mesh, spec, poison=False))
    opt_cpu = OPTIMIZERS[name]([p_cpu])
    opt_dev = OPTIMIZERS[name]([p_dev])
    for it in range(3):
        g = T(10, 6, seed=10 + it)
        p_cpu.grad = g.clone()
        p_dev.grad = to_device(g, mesh, spec)
        step([])
        opt_cpu.step()
        opt_dev.step()
        stats = step([p_dev])
        assert stats["collectives"] == [], (it, stats["collectives"])
        assert not stats["replicated_fallback_ops"], stats["replicated_fallback_ops"]
        assert_same(p_dev.detach().cpu(), p_cpu.detach(), f"param after step {it}",
                    **OPTIMIZER_TOLERANCE.get(name, {}))
    assert torch_spmd._C._get_sharding_spec(p_dev) != "", "the parameter lost its sharding"


def test_addmm_beta_zero_ignores_nan_bias():
    mesh = mesh_of((4, 2))
    bias = torch.full((5,), float("nan"), dtype=torch.float64)
    for specs in [[None, (None, "model"), ("model", None)], [None, ("data", None), (None, "model")]]:
        r = check(lambda b, x, w: torch.addmm(b, x, w, beta=0, alpha=1.5), [bias, T(10, 6), T(6, 5)],
                  specs, mesh)
        assert torch.isfinite(r.dev_out[0]).all()


def test_positional_ops_on_zero_dim_tensors():
    # dim=0 / -1 name the only "dim" of a 0-dim tensor; the rule must not index a dim it lacks
    # (this crashed the process before).
    mesh = mesh_of((8,))
    for fn in [lambda t: torch.cumsum(t, 0), lambda t: torch.cumprod(t, -1),
               lambda t: torch.softmax(t, 0), lambda t: torch.log_softmax(t, -1),
               lambda t: torch.sort(t, 0)[0], lambda t: torch.topk(t, 1, 0)[0]]:
        check(fn, [torch.tensor(1.5, dtype=torch.float64)], [None], mesh, grad=True)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.bool])
def test_max_min_over_padded_sharded_dim_of_integers(dtype):
    # The padding of an uneven shard is filled with the reduction's identity: +-inf for floats,
    # the dtype's extreme values for integers and bools.
    mesh = mesh_of((8,))
    x = (torch.arange(10) % 7).to(dtype)
    check(lambda t: (t.amax(0), t.amin(0), t.max(), t.min()), [x], [("x",)], mesh, poison=False)


@pytest.mark.parametrize("spec", [None, ("x", None)])
def test_host_index_tensors_as_with_cuda(spec):
    # index/index_put accept index tensors on the host next to a device self, as CUDA does;
    # other ops still refuse host tensors of dim > 0.
    mesh = mesh_of((8,))
    rows, mask = torch.tensor([0, 5, 15, 5]), torch.arange(16) % 3 == 0

    def fn(x):
        y = x.clone()
        y[rows[:2]] = 7.0
        y.index_put_((rows,), torch.ones_like(x[rows]), accumulate=True)
        return x[rows], x[:, torch.tensor([2, 0])], y

    # (indexing a sharded dim gathers it, whichever side the indices live on)
    check(fn, [T(16, 3)], [spec], mesh, fallback_ok=True)
    from spmd_diff import to_device
    x = to_device(T(16, 3), mesh, spec, poison=False)
    assert torch.equal(x[mask].cpu(), T(16, 3)[mask])
    with pytest.raises(RuntimeError, match="same device"):
        x + torch.ones(16, 3, dtype=torch.float64)


@pytest.mark.parametrize("mesh_shape,spec", INDEX_CASES, ids=ids(INDEX_CASES))
def test_full_slices_and_padding_other_dims_keep_the_sharding(mesh_shape, spec):
    # A slice that keeps a dim whole is the identity on it, and padding one dim leaves the
    # others sharded (Hugging Face's loss pads the labels' sequence with the batch sharded,
    # and slices the hidden states with slice(-0, None)): no communication.
    mesh = mesh_of(mesh_shape)
    check(lambda x: x[0:, :] * 2, [T(10, 6)], [spec], mesh, grad=True, fwd=[], bwd=[])
    check(lambda x: x[:, 0:100] + 1, [T(10, 6)], [spec], mesh, grad=True, fwd=[], bwd=[])
    check(lambda x: torch.nn.functional.pad(x, (0, 1), value=-100), [T(10, 6)],
          [(spec[0], None)], mesh, grad=True, fwd=[], bwd=[])
    # A slice that drops elements of a sharded dim still moves data, and stays right.
    check(lambda x: x[1:, :] * 2, [T(10, 6)], [spec], mesh, grad=True)


def test_every_rule_names_an_op_of_this_torch():
    # A misspelt name in a rule file would leave the op without its rule, silently replicated.
    from helpers import missing_from_this_torch
    from torch_spmd import _C
    ops = set(torch._C._dispatch_get_all_op_names())
    bare = {name.split(".")[0] for name in ops}
    names = _C._sharding_rule_names()
    assert len(names) > 200 and len(names) == len(set(names))
    missing = []
    for name in names:
        if name.endswith("*"):
            found = any(op.startswith(name[:-1]) for op in ops)
        elif "." in name:
            found = name in ops
        else:
            found = name in bare
        if not found and not missing_from_this_torch(name):
            missing.append(name)
    assert not missing, f"rules for ops torch {torch.__version__} does not have: {missing}"
