"""Property-based differential tests of the partitioner.

Hypothesis builds random programs (40+ op kinds: pointwise with broadcasting, reductions, the
matmul family, views, permutes, slicing, concatenation and splitting, softmax, layer norm,
indexing, in-place updates) over random meshes ((8,), (4,2), (2,4), (2,2,2), (1,8), (8,1), and a
mesh with a permuted device order), with random partition specs on the inputs (uneven dims
everywhere: sizes 1..10 over 2, 4 and 8-way axes; padding poisoned with NaN) and random
sharding constraints on intermediates, and checks every output (and, in one test, every input
gradient) against the same program run eagerly on CPU in float64.

Runs are reproducible (derandomize=True) and need no example database. Case counts per run:
RESHARD_EXAMPLES + FORWARD_EXAMPLES + GRAD_EXAMPLES (see below), over 2000 in total.
"""
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spmd_diff import MESH_AXES, assert_same, constrain, ensure_devices, mesh_of, run

import os

# Minutes of work (processes, examples, sweeps): scripts/test.sh runs it, plain pytest does not.
pytestmark = pytest.mark.slow
_SCALE = float(os.environ.get("SPMD_PROPERTY_SCALE", "1"))
RESHARD_EXAMPLES = int(700 * _SCALE)
FORWARD_EXAMPLES = int(1000 * _SCALE)
GRAD_EXAMPLES = int(450 * _SCALE)

RTOL, ATOL = 1e-7, 1e-9

MESHES = [((8,), None), ((4, 2), None), ((2, 4), None), ((2, 2, 2), None), ((1, 8), None),
          ((8, 1), None), ((4, 2), [7, 6, 5, 4, 3, 2, 1, 0]), ((2, 2, 2), [0, 4, 2, 6, 1, 5, 3, 7])]
SIZES = [1, 2, 3, 4, 5, 6, 7, 8, 10]


# SPMD_PROPERTY_SCALE multiplies the example counts; SPMD_PROPERTY_RANDOM=1 draws fresh random
# examples instead of the fixed reproducible ones (for bug hunting; failures print the drawn
# program).
_RANDOM = os.environ.get("SPMD_PROPERTY_RANDOM", "0") not in ("", "0")


def _settings(n):
    return settings(max_examples=max(n, 1), deadline=None, derandomize=not _RANDOM, database=None,
                    suppress_health_check=list(HealthCheck), print_blob=_RANDOM)


@pytest.fixture(scope="module", autouse=True)
def devices():
    ensure_devices()
    yield


# ---------------------------------------------------------------------------------------------
# Strategies


def draw_mesh(draw):
    shape, ids = draw(st.sampled_from(MESHES))
    return mesh_of(shape, device_ids=ids), MESH_AXES[shape]


def draw_spec(draw, axes, rank):
    """A random partition spec: each mesh axis unused or tiling one dim, several axes on a dim
    in a random order."""
    if rank == 0:
        return ()
    dims = [[] for _ in range(rank)]
    for a in draw(st.permutations(list(axes))):
        d = draw(st.integers(-1, rank - 1))
        if d >= 0:
            dims[d].append(a)
    return tuple(None if not d else (d[0] if len(d) == 1 else tuple(d)) for d in dims)


def draw_shape(draw, min_rank=1, max_rank=3, max_elems=160):
    rank = draw(st.integers(min_rank, max_rank))
    shape = []
    for _ in range(rank):
        shape.append(draw(st.sampled_from(SIZES)))
    while math.prod(shape) > max_elems:
        i = shape.index(max(shape))
        shape[i] = max(1, shape[i] // 2)
    return tuple(shape)


def rand(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64)


# ---------------------------------------------------------------------------------------------
# Reshards: a chain of constraints on one tensor (every layout change the reshard pass knows)


@_settings(RESHARD_EXAMPLES)
@given(st.data())
def test_random_reshard_chains(data):
    draw = data.draw
    mesh, axes = draw_mesh(draw)
    shape = draw_shape(draw, 1, 3, 200)
    specs = [draw_spec(draw, axes, len(shape)) for _ in range(draw(st.integers(1, 4)))]
    in_spec = draw_spec(draw, axes, len(shape))
    mode = draw(st.sampled_from(["plain", "partial", "sum"]))
    rank = len(shape)

    def fn(x, w):
        y = x * 1.5
        if mode == "partial":
            # A pending partial sum (contraction over a sharded dim) as the chain's source.
            y = torch.einsum("...i,ij->...j", y, w)
        for s in specs:
            y = constrain(y + 0.25, s)
        if mode == "sum":
            return y.sum(0), y
        return y

    w = rand((shape[-1], shape[-1]), 1)
    w_spec = (in_spec[-1], None) if in_spec[-1] is not None else None
    r = run(fn, [rand(shape, 0), w], [in_spec, w_spec], mesh)
    for i, (a, e) in enumerate(zip(r.dev_out, r.cpu_out)):
        assert_same(a, e, f"output {i} (mesh {mesh.mesh_shape}, {in_spec} -> {specs})", RTOL, ATOL)
    assert rank >= 1


# ---------------------------------------------------------------------------------------------
# Random programs


class Gen:
    """Builds a random program op by op. Each instruction is a function of the value pool (and
    the integer index inputs) that appends its results; it runs once on CPU while the program
    is generated (to know shapes) and again on both sides when the program is checked."""

    def __init__(self, draw, axes, grad):
        self.draw = draw
        self.axes = axes
        self.grad = grad
        self.instructions = []
        self.pool = []  # CPU values (float64), for shapes
        self.index_inputs = []  # CPU integer tensors
        self.index_specs = []
        self.kinds = []

    # -- helpers
    def pick(self, cond=lambda t: True):
        cands = [i for i, t in enumerate(self.pool) if cond(t)]
        if not cands:
            return None
        return self.draw(st.sampled_from(cands))

    def dim(self, t):
        return self.draw(st.integers(0, t.dim() - 1))

    def emit(self, kind, fn):
        """fn(pool, idx) -> a tensor or a list of tensors to append."""
        out = fn(self.pool, self.index_inputs)
        outs = list(out) if isinstance(out, (list, tuple)) else [out]
        for o in outs:
            if o.dtype != torch.float64 or o.numel() > 400 or o.dim() > 4:
                return False
        self.instructions.append(fn)
        self.kinds.append(kind)
        self.pool.extend(outs)
        return True

    def index_input(self, high, shape):
        g = torch.Generator().manual_seed(len(self.index_inputs) + 11)
        t = torch.randint(0, max(high, 1), shape, generator=g)
        k = len(self.index_inputs)
        self.index_inputs.append(t)
        self.index_specs.append(self.draw(st.one_of(st.none(), st.just(draw_spec(self.draw, self.axes, len(shape))))))
        return k

    # -- one random op
    def step(self):
        d = self.draw
        op = d(st.sampled_from(OPS))
        return op(self)


def _unary(name, f):
    def op(g):
        i = g.pick()
        return g.emit(name, lambda p, x: f(p[i]))
    return op


UNARY = [
    ("tanh", torch.tanh), ("sigmoid", torch.sigmoid), ("relu", torch.relu), ("gelu", F.gelu),
    ("silu", F.silu), ("sin", torch.sin), ("abs", torch.abs), ("neg", torch.neg),
    ("affine", lambda x: x * 2.5 - 1.0), ("clamp", lambda x: x.clamp(-0.7, 0.5)),
    ("softplus", F.softplus), ("log1p_abs", lambda x: x.abs().log1p()),
    ("sqrt1", lambda x: (x * x + 1).sqrt()), ("exp_tanh", lambda x: x.tanh().exp()),
    ("leaky", lambda x: F.leaky_relu(x, 0.2)), ("erf", torch.erf), ("square", torch.square),
    ("where_pos", lambda x: torch.where(x > 0, x, x * 0.1)), ("to_f32_back", lambda x: x.float().double()),
    ("masked_fill", lambda x: x.masked_fill(x < -0.5, 0.25)),
]


def _broadcastable(a, b):
    try:
        torch.broadcast_shapes(a.shape, b.shape)
        return True
    except RuntimeError:
        return False


def _binary(name, f):
    def op(g):
        i = g.pick()
        a = g.pool[i]
        j = g.pick(lambda t: _broadcastable(a, t) and math.prod(torch.broadcast_shapes(a.shape, t.shape)) <= 400)
        if j is None or g.draw(st.integers(0, 4)) == 0:
            # A broadcast partner made from a itself: a reduction with keepdim (its result is
            # often a pending partial sum), or a slice of size 1.
            dim = g.dim(a)
            if g.draw(st.booleans()):
                return g.emit(name, lambda p, x: f(p[i], p[i].sum(dim, keepdim=True)))
            return g.emit(name, lambda p, x: f(p[i].narrow(dim, 0, 1), p[i]))
        swap = g.draw(st.booleans())
        if swap:
            return g.emit(name, lambda p, x: f(p[j], p[i]))
        return g.emit(name, lambda p, x: f(p[i], p[j]))
    return op


BINARY = [
    ("add", torch.add), ("sub", torch.sub), ("mul", torch.mul),
    ("div", lambda a, b: a / (b * b + 1)), ("maximum", torch.maximum), ("minimum", torch.minimum),
    ("where", lambda a, b: torch.where(a > b, a, b)), ("lerp", lambda a, b: a + 0.3 * (b - a)),
    ("atan2", torch.atan2),
]


def op_reduce(g):
    i = g.pick()
    t = g.pool[i]
    kind = g.draw(st.sampled_from(["sum", "mean", "amax", "amin", "max_dim", "min_dim", "var",
                                   "std", "logsumexp", "norm", "argmax", "prod", "sum_all",
                                   "mean_all"]))
    nd = g.draw(st.integers(1, t.dim()))
    dims = sorted(g.draw(st.permutations(list(range(t.dim()))))[:nd])
    dim = dims[0]
    keep = g.draw(st.booleans())
    fns = {
        "sum": lambda x: x.sum(dims, keepdim=keep), "mean": lambda x: x.mean(dims, keepdim=keep),
        "amax": lambda x: x.amax(dims, keepdim=keep), "amin": lambda x: x.amin(dims, keepdim=keep),
        "max_dim": lambda x: x.max(dim, keepdim=keep).values,
        "min_dim": lambda x: x.min(dim, keepdim=keep).values,
        "var": lambda x: x.var(dims, unbiased=False, keepdim=keep),
        "std": lambda x: (x.std(dim, unbiased=False, keepdim=keep) + 1e-3),
        "logsumexp": lambda x: x.logsumexp(dims, keepdim=keep),
        "norm": lambda x: (x * x + 0.01).sum(dims, keepdim=keep).sqrt(),
        "argmax": lambda x: x.argmax(dim, keepdim=keep).to(torch.float64),
        "prod": lambda x: (x.tanh() * 0.5 + 1).prod(dim, keepdim=keep),
        "sum_all": lambda x: x.sum(), "mean_all": lambda x: x.mean(),
    }
    f = fns[kind]
    return g.emit("reduce_" + kind, lambda p, x: f(p[i]))


def op_matmul(g):
    i = g.pick(lambda t: t.dim() >= 2)
    if i is None:
        i = g.pick()
        return g.emit("outer", lambda p, x: p[i].reshape(-1, 1) @ p[i].reshape(1, -1)[:, :6])
    a = g.pool[i]
    k = a.shape[-1]
    kind = g.draw(st.sampled_from(["gram", "pool", "linear", "addmm", "bmm", "baddbmm"]))
    if kind == "pool":
        j = g.pick(lambda t: t.dim() == 2 and t.shape[0] == k)
        if j is not None:
            if a.dim() == 2:
                return g.emit("mm", lambda p, x: p[i] @ p[j])
            return g.emit("matmul", lambda p, x: torch.matmul(p[i], p[j]))
        kind = "gram"
    if kind == "linear":
        j = g.pick(lambda t: t.dim() == 2 and t.shape[1] == k)
        if j is not None:
            return g.emit("linear", lambda p, x: F.linear(p[i], p[j]))
        kind = "gram"
    if kind == "addmm" and a.dim() == 2:
        return g.emit("addmm", lambda p, x: torch.addmm(p[i].sum(1, keepdim=True), p[i], p[i].t(), beta=0.5, alpha=2.0))
    if kind in ("bmm", "baddbmm") and a.dim() == 3:
        if kind == "bmm":
            return g.emit("bmm", lambda p, x: torch.bmm(p[i], p[i].transpose(1, 2)))
        return g.emit("baddbmm", lambda p, x: torch.baddbmm(p[i][..., :1], p[i].transpose(1, 2), p[i], alpha=0.5))
    # a @ a^T over the last dim (contraction over whatever shards the last dim).
    return g.emit("gram", lambda p, x: torch.matmul(p[i], p[i].transpose(-1, -2)))


def op_view(g):
    i = g.pick()
    t = g.pool[i]
    kind = g.draw(st.sampled_from(["merge", "split", "flatten", "permute", "transpose", "unsqueeze",
                                   "squeeze", "expand", "t", "reshape_any"]))
    if kind == "merge" and t.dim() >= 2:
        d = g.draw(st.integers(0, t.dim() - 2))
        shape = list(t.shape[:d]) + [t.shape[d] * t.shape[d + 1]] + list(t.shape[d + 2:])
        return g.emit("view_merge", lambda p, x: p[i].reshape(shape))
    if kind == "split":
        d = g.dim(t)
        n = t.shape[d]
        facs = [f for f in range(2, n) if n % f == 0]
        if facs and t.dim() < 4:
            f = g.draw(st.sampled_from(facs))
            shape = list(t.shape[:d]) + [f, n // f] + list(t.shape[d + 1:])
            return g.emit("view_split", lambda p, x: p[i].reshape(shape))
    if kind == "flatten":
        return g.emit("flatten", lambda p, x: p[i].flatten())
    if kind == "permute" and t.dim() >= 2:
        perm = g.draw(st.permutations(list(range(t.dim()))))
        return g.emit("permute", lambda p, x: p[i].permute(*perm))
    if kind == "transpose" and t.dim() >= 2:
        a, b = g.draw(st.permutations(list(range(t.dim()))))[:2]
        return g.emit("transpose", lambda p, x: p[i].transpose(a, b))
    if kind == "t" and t.dim() == 2:
        return g.emit("t", lambda p, x: p[i].t())
    if kind == "unsqueeze" and t.dim() < 4:
        d = g.draw(st.integers(0, t.dim()))
        return g.emit("unsqueeze", lambda p, x: p[i].unsqueeze(d))
    if kind == "squeeze" and 1 in t.shape:
        d = list(t.shape).index(1)
        return g.emit("squeeze", lambda p, x: p[i].squeeze(d))
    if kind == "expand" and 1 in t.shape:
        d = list(t.shape).index(1)
        shape = list(t.shape)
        shape[d] = g.draw(st.sampled_from([2, 3, 4, 5]))
        return g.emit("expand", lambda p, x: p[i].expand(*shape))
    if kind == "reshape_any":
        # Any regrouping of the elements (often not a pure split or merge).
        n = t.numel()
        facs = [f for f in range(1, n + 1) if n % f == 0]
        f = g.draw(st.sampled_from(facs))
        return g.emit("reshape_any", lambda p, x: p[i].reshape(f, n // f))
    return g.emit("contiguous_t", lambda p, x: p[i].transpose(0, -1).contiguous())


def op_move(g):
    i = g.pick()
    t = g.pool[i]
    d = g.dim(t)
    n = t.shape[d]
    kind = g.draw(st.sampled_from(["slice", "select", "narrow", "flip", "roll", "cat", "cat_pool",
                                   "stack", "split", "chunk", "pad", "cumsum", "repeat", "tril",
                                   "index_select", "gather"]))
    if kind == "slice" and n > 1:
        a = g.draw(st.integers(0, n - 1))
        b = g.draw(st.integers(a + 1, n))
        step = g.draw(st.integers(1, 3))
        sl = [slice(None)] * d + [slice(a, b, step)]
        return g.emit("slice", lambda p, x: p[i][tuple(sl)])
    if kind == "select" and t.dim() > 1:
        k = g.draw(st.integers(-n, n - 1))
        return g.emit("select", lambda p, x: p[i].select(d, k))
    if kind == "narrow" and n > 1:
        a = g.draw(st.integers(0, n - 1))
        return g.emit("narrow", lambda p, x: p[i].narrow(d, a, n - a))
    if kind == "flip":
        return g.emit("flip", lambda p, x: p[i].flip(d))
    if kind == "roll":
        s = g.draw(st.integers(-3, 3))
        return g.emit("roll", lambda p, x: p[i].roll(s, d))
    if kind == "cat_pool":
        j = g.pick(lambda u: u.dim() == t.dim() and all(u.shape[k] == t.shape[k] for k in range(t.dim()) if k != d))
        if j is not None:
            return g.emit("cat_pool", lambda p, x: torch.cat([p[i], p[j]], d))
    if kind in ("cat", "cat_pool"):
        return g.emit("cat", lambda p, x: torch.cat([p[i], p[i].tanh(), p[i].narrow(d, 0, 1)], d))
    if kind == "stack":
        j = g.pick(lambda u: u.shape == t.shape)
        sd = g.draw(st.integers(0, t.dim()))
        return g.emit("stack", lambda p, x: torch.stack([p[i], p[j] * 2], sd))
    if kind == "split" and n > 1:
        s = g.draw(st.integers(1, n - 1))
        return g.emit("split", lambda p, x: list(p[i].split(s, d)))
    if kind == "chunk":
        c = g.draw(st.integers(1, 3))
        return g.emit("chunk", lambda p, x: list(p[i].chunk(c, d)))
    if kind == "pad":
        lo, hi = g.draw(st.integers(0, 2)), g.draw(st.integers(0, 2))
        return g.emit("pad", lambda p, x: F.pad(p[i], (lo, hi)))
    if kind == "cumsum":
        return g.emit("cumsum", lambda p, x: p[i].cumsum(d))
    if kind == "repeat" and t.numel() <= 100:
        reps = [1] * t.dim()
        reps[d] = 2
        return g.emit("repeat", lambda p, x: p[i].repeat(*reps))
    if kind == "tril" and t.dim() >= 2:
        return g.emit("tril", lambda p, x: p[i].tril())
    if kind == "index_select":
        k = g.index_input(n, (g.draw(st.integers(1, 7)),))
        return g.emit("index_select", lambda p, x: p[i].index_select(d, x[k]))
    if kind == "gather":
        shape = list(t.shape)
        shape[d] = g.draw(st.integers(1, 5))
        k = g.index_input(n, tuple(shape))
        return g.emit("gather", lambda p, x: p[i].gather(d, x[k]))
    return g.emit("clone", lambda p, x: p[i].clone())


def op_nn(g):
    i = g.pick()
    t = g.pool[i]
    d = g.dim(t)
    kind = g.draw(st.sampled_from(["softmax", "log_softmax", "layer_norm", "layer_norm2", "normalize",
                                   "mse", "embedding", "scatter_add", "index_add", "inplace", "setitem_free"]))
    if kind == "softmax":
        return g.emit("softmax", lambda p, x: p[i].softmax(d))
    if kind == "log_softmax":
        return g.emit("log_softmax", lambda p, x: p[i].log_softmax(d))
    if kind == "layer_norm":
        return g.emit("layer_norm", lambda p, x: F.layer_norm(p[i], p[i].shape[-1:]))
    if kind == "layer_norm2" and t.dim() >= 2:
        w = g.pick(lambda u: u.shape == t.shape[-1:])
        if w is not None:
            return g.emit("layer_norm_affine", lambda p, x: F.layer_norm(p[i], p[i].shape[-1:], p[w], p[w] * 0.5))
        return g.emit("layer_norm_2d", lambda p, x: F.layer_norm(p[i], p[i].shape[-2:]))
    if kind == "normalize":
        return g.emit("normalize", lambda p, x: F.normalize(p[i], dim=d))
    if kind == "mse":
        red = g.draw(st.sampled_from(["mean", "sum", "none"]))
        return g.emit("mse_" + red, lambda p, x: F.mse_loss(p[i], p[i].tanh(), reduction=red))
    if kind == "embedding" and t.dim() == 2:
        k = g.index_input(t.shape[0], (g.draw(st.integers(1, 3)), g.draw(st.integers(1, 4))))
        return g.emit("embedding", lambda p, x: F.embedding(x[k], p[i]))
    if kind == "scatter_add":
        k = g.index_input(t.shape[d], tuple(t.shape))
        return g.emit("scatter_add", lambda p, x: p[i].scatter_add(d, x[k], p[i].tanh()))
    if kind == "index_add":
        k = g.index_input(t.shape[d], (t.shape[d],))
        return g.emit("index_add", lambda p, x: p[i].index_add(d, x[k], p[i] * 0.5))
    if kind == "inplace":
        j = g.pick(lambda u: _broadcastable(t, u) and torch.broadcast_shapes(t.shape, u.shape) == t.shape)

        def f(p, x):
            y = p[i] * 1.0
            y.add_(p[j], alpha=0.5)
            y.mul_(0.75)
            return y
        return g.emit("inplace", f)
    # A write through a view without autograd on it (no as_strided replay involved).
    n = t.shape[d]

    def h(p, x):
        y = p[i] * 1.0
        return torch.cat([y.narrow(d, 0, 1) * 3, y.narrow(d, 1, n - 1)], d) if n > 1 else y * 3
    return g.emit("cat_update", h)


def op_constrain(g):
    i = g.pick()
    spec = draw_spec(g.draw, g.axes, g.pool[i].dim())
    return g.emit("constraint", lambda p, x: constrain(p[i].clone(), spec))


OPS = ([_unary(n, f) for n, f in UNARY] + [_binary(n, f) for n, f in BINARY] +
       [op_reduce] * 4 + [op_matmul] * 4 + [op_view] * 5 + [op_move] * 6 + [op_nn] * 4 +
       [op_constrain] * 5)


def build_program(draw, grad):
    mesh, axes = draw_mesh(draw)
    g = Gen(draw, axes, grad)
    n_inputs = draw(st.integers(1, 3))
    inputs, specs = [], []
    for k in range(n_inputs):
        shape = draw_shape(draw)
        inputs.append(rand(shape, k))
        specs.append(draw_spec(draw, axes, len(shape)))
    g.pool = [x.clone() for x in inputs]
    n_ops = draw(st.integers(3, 12))
    tries = 0
    while len(g.instructions) < n_ops and tries < 4 * n_ops:
        tries += 1
        try:
            g.step()
        except (RuntimeError, IndexError, ValueError, TypeError):
            pass  # an op that does not apply to the drawn shapes: draw another
    n_float = len(inputs)
    instructions = list(g.instructions)
    n_pool = len(g.pool)
    # Outputs: the last value and a random subset of the others (outputs change how partial
    # sums are kept pending).
    outputs = sorted({n_pool - 1} | set(draw(st.lists(st.integers(0, n_pool - 1), max_size=3))))

    def program(*args):
        pool = list(args[:n_float])
        idx = list(args[n_float:])
        for ins in instructions:
            out = ins(pool, idx)
            pool.extend(out if isinstance(out, (list, tuple)) else [out])
        return [pool[o] for o in outputs]

    all_inputs = inputs + g.index_inputs
    all_specs = specs + g.index_specs
    return mesh, program, all_inputs, all_specs, g.kinds, n_float


def check_program(mesh, program, inputs, specs, kinds, grad):
    what = f"mesh {mesh.mesh_shape} ids {list(mesh.device_ids)} specs {specs} ops {kinds}"
    r = run(program, inputs, specs, mesh, grad=grad)
    for i, (a, e) in enumerate(zip(r.dev_out, r.cpu_out)):
        assert_same(a, e, f"output {i} of {what}", RTOL, ATOL)
    for i, (a, e) in enumerate(zip(r.dev_grads, r.cpu_grads)):
        if e is None:
            continue
        assert_same(a, e, f"grad {i} of {what}", RTOL, ATOL)
    return r


_kind_counts = {}


@_settings(FORWARD_EXAMPLES)
@given(st.data())
def test_random_programs(data):
    mesh, program, inputs, specs, kinds, _ = build_program(data.draw, grad=False)
    for k in kinds:
        _kind_counts[k] = _kind_counts.get(k, 0) + 1
    check_program(mesh, program, inputs, specs, kinds, grad=False)


@_settings(GRAD_EXAMPLES)
@given(st.data())
def test_random_programs_with_gradients(data):
    mesh, program, inputs, specs, kinds, n_float = build_program(data.draw, grad=True)
    for k in kinds:
        _kind_counts[k] = _kind_counts.get(k, 0) + 1
    check_program(mesh, program, inputs, specs, kinds, grad=list(range(n_float)))


def test_op_kind_coverage():
    # The generator must exercise the op families it claims to (run after the two tests above).
    if not _kind_counts:
        pytest.skip("random program tests did not run in this session")
    assert len(_kind_counts) >= 40, sorted(_kind_counts)
