"""Differential-testing helpers: run the same program on CPU eager and on the spmd device and
compare everything observable (outputs, input gradients, inputs mutated in place).

The device run is lazy: before anything is synced we read the pending IR of the outputs and
gradients (``torch_spmd.debug.graph_text``) and the eager-fallback counters, so a test can also
check *which* ATen ops the device really recorded or ran (op coverage is measured, not claimed).
"""
import math
import re
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Set

import torch

import torch_spmd
import torch_spmd.core.xla_model as xm
from torch_spmd import debug
from torch_spmd.debug import metrics

DEV = torch_spmd.device()

# Tight by default: the device runs the very same CPU kernels, so results should agree to the
# last ulp or so (torch's own float32 defaults).
RTOL = 1.3e-6
ATOL = 1e-5


class Host:
    """Marks a test input that must stay on the CPU in the device run too (e.g. a 0-dim host
    tensor next to device tensors)."""

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor


# Ops that a rule or a named-op entry names but that older supported torches lack, with the
# first torch that has them: the name checks accept their absence there only.
OPS_OF_NEWER_TORCH = {"aten::_grouped_mm": (2, 8)}


def missing_from_this_torch(name: str) -> bool:
    """Whether `name` is an op of a newer torch than this one (OPS_OF_NEWER_TORCH)."""
    first = OPS_OF_NEWER_TORCH.get(name)
    return first is not None and tuple(int(p) for p in torch.__version__.split(".")[:2]) < first


def seed_for(name: str) -> int:
    return zlib.crc32(name.encode()) & 0x7FFFFFFF


def tree_map(fn, obj):
    if isinstance(obj, (list, tuple)):
        mapped = [tree_map(fn, o) for o in obj]
        if hasattr(obj, "_fields"):  # namedtuple (torch.return_types are tuples too)
            return type(obj)(*mapped)
        return type(obj)(mapped) if isinstance(obj, list) else tuple(mapped)
    if isinstance(obj, dict):
        return {k: tree_map(fn, v) for k, v in obj.items()}
    return fn(obj)


def tree_leaves(obj) -> List[Any]:
    out = []
    tree_map(lambda x: out.append(x), obj)
    return out


def to_device(obj, device=DEV):
    """Moves every tensor in `obj` to `device`, keeping leaves that require grad leaves."""

    def move(x):
        if isinstance(x, Host):
            return x.tensor
        if isinstance(x, torch.Tensor):
            y = x.detach().to(device)
            if x.requires_grad:
                y.requires_grad_()
            return y
        return x

    return tree_map(move, obj)


def to_cpu(obj):
    def move(x):
        if isinstance(x, torch.Tensor) and x.device.type != "cpu":
            return x.detach().cpu()
        return x

    return tree_map(move, obj)


def clone_inputs(obj):
    def clone(x):
        if isinstance(x, Host):
            return Host(x.tensor.clone())
        if isinstance(x, torch.Tensor):
            y = x.detach().clone()
            y.requires_grad_(x.requires_grad)
            return y
        return x

    return tree_map(clone, obj)


def assert_same(actual, expected, rtol=RTOL, atol=ATOL, what="output"):
    """Structure, dtypes, shapes and values of `actual` (device) equal `expected` (CPU)."""
    if isinstance(expected, (list, tuple)):
        assert isinstance(actual, (list, tuple)), f"{what}: expected a sequence, got {type(actual)}"
        assert len(actual) == len(expected), f"{what}: length {len(actual)} != {len(expected)}"
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_same(a, e, rtol, atol, f"{what}[{i}]")
        return
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{what}: expected a tensor, got {type(actual)}"
        assert actual.device == DEV, f"{what}: on {actual.device}, expected {DEV}"
        assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
        assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
        torch.testing.assert_close(actual.detach().cpu(), expected.detach(), rtol=rtol, atol=atol,
                                   equal_nan=True, msg=lambda m: f"{what}: {m}")
        return
    if isinstance(expected, float) and math.isnan(expected):
        assert isinstance(actual, float) and math.isnan(actual), f"{what}: {actual} != nan"
        return
    if isinstance(expected, float):
        assert actual == expected or abs(actual - expected) <= atol + rtol * abs(expected), \
            f"{what}: {actual} != {expected}"
        return
    assert actual == expected, f"{what}: {actual!r} != {expected!r}"


# ---- which ATen ops a device run recorded or ran eagerly -------------------------------------

_NODE_RE = re.compile(r"= (aten::[A-Za-z0-9_]+)(?:\.[A-Za-z0-9_]+)?\(")


def base_op_name(qualified: str) -> str:
    """'aten::sum.dim_IntList' -> 'sum'; functionalized view copies ('aten::t_copy') -> 't'."""
    name = qualified.split("::", 1)[-1].split(".", 1)[0]
    if name.endswith("_copy") and name not in ("_to_copy", "_copy_from"):
        name = name[: -len("_copy")]
    return name


def recorded_ops(tensors: Sequence[torch.Tensor]) -> Set[str]:
    tensors = [t for t in tensors if isinstance(t, torch.Tensor) and t.device == DEV]
    if not tensors:
        return set()
    text = debug.graph_text(tensors)
    return {base_op_name(m) for m in _NODE_RE.findall(text)}


def eager_counters() -> Dict[str, int]:
    return {n: metrics.counter_value(n) for n in metrics.counter_names() if n.startswith("aten::")}


def eager_ops_since(before: Dict[str, int]) -> Set[str]:
    return {base_op_name(n) for n, v in eager_counters().items() if v > before.get(n, 0)}


# ---- the differential runner ------------------------------------------------------------------

def _cotangent(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    return torch.randn(t.shape, generator=gen, dtype=torch.float32).to(t.dtype)


def _grad_outputs(out) -> List[torch.Tensor]:
    return [t for t in tree_leaves(out)
            if isinstance(t, torch.Tensor) and t.requires_grad and t.grad_fn is not None]


def _grad_inputs(inputs) -> List[torch.Tensor]:
    return [t for t in tree_leaves(inputs) if isinstance(t, torch.Tensor) and t.requires_grad]


@dataclass
class Result:
    cpu_out: Any
    dev_out: Any
    ops: Set[str] = field(default_factory=set)    # recorded or eagerly run on the device
    eager: Set[str] = field(default_factory=set)  # ran eagerly on the host (EagerFallback)


def check(fn: Callable, *inputs, grad: bool = True, rtol: float = RTOL, atol: float = ATOL,
          grad_rtol: Optional[float] = None, grad_atol: Optional[float] = None,
          compare: Optional[Callable] = None, lazy: bool = True) -> Result:
    """Runs ``fn(*inputs)`` on CPU and on the device and compares outputs, the gradients of
    every input that requires grad (for random cotangents) and every input afterwards (in-place
    mutations). ``compare(dev_out, cpu_out)`` replaces the output comparison when given.
    ``lazy=False`` allows the program to execute graphs before its results are read (torch
    itself calls ``.item()`` in a few backward formulas on non-CUDA devices)."""
    cpu_in = tree_map(lambda x: x.tensor if isinstance(x, Host) else x, clone_inputs(inputs))
    dev_in = to_device(clone_inputs(inputs))
    before = eager_counters()
    graphs_before = metrics.counter_value("ExecuteGraph") or 0

    cpu_out = fn(*cpu_in)
    dev_out = fn(*dev_in)

    cpu_grads = dev_grads = None
    cpu_go, dev_go = _grad_outputs(cpu_out), _grad_outputs(dev_out)
    assert len(cpu_go) == len(dev_go), "different number of differentiable outputs"
    cpu_gi, dev_gi = _grad_inputs(cpu_in), _grad_inputs(dev_in)
    if grad and cpu_go and cpu_gi:
        gen = torch.Generator().manual_seed(1234)
        cots = [_cotangent(t, gen) for t in cpu_go]
        cpu_grads = torch.autograd.grad(cpu_go, cpu_gi, cots, allow_unused=True)
        dev_grads = torch.autograd.grad(dev_go, dev_gi, [c.to(DEV) for c in cots],
                                        allow_unused=True)

    # What the device recorded, before anything is synced.
    pending = [t for t in tree_leaves(dev_out) + list(dev_grads or []) + tree_leaves(dev_in)
               if isinstance(t, torch.Tensor)]
    eager = eager_ops_since(before)
    ops = recorded_ops([t.detach() for t in pending]) | eager
    # Laziness: unless an op had to run eagerly, nothing may have executed yet.
    graphs = (metrics.counter_value("ExecuteGraph") or 0) - graphs_before
    assert eager or not lazy or graphs == 0, f"{graphs} graph(s) executed before any result was read"

    if compare is not None:
        compare(dev_out, cpu_out)
    else:
        assert_same(dev_out, cpu_out, rtol, atol, "output")
    if cpu_grads is not None:
        for i, (dg, cg) in enumerate(zip(dev_grads, cpu_grads)):
            assert (dg is None) == (cg is None), f"grad[{i}]: defined on one side only"
            if cg is not None:
                assert_same(dg, cg, grad_rtol or rtol, grad_atol or atol, f"grad[{i}]")
    # In-place writes to the inputs must be identical too.
    for i, (d, c) in enumerate(zip(tree_leaves(dev_in), tree_leaves(cpu_in))):
        if isinstance(c, torch.Tensor) and c.device.type == "cpu" and isinstance(d, torch.Tensor) \
                and d.device == DEV:
            assert_same(d.detach(), c.detach(), rtol, atol, f"input[{i}] after the call")
    return Result(cpu_out, dev_out, ops, eager)


def rand(*shape, dtype=torch.float32, requires_grad=False, low=None, high=None, gen=None):
    """A deterministic random CPU tensor: floats ~ N(0,1) (or U[low,high)), ints in
    [low, high), bools ~ Bernoulli(0.5)."""
    gen = gen or torch.Generator().manual_seed(seed_for(repr((shape, dtype, low, high))))
    if dtype == torch.bool:
        t = torch.rand(shape, generator=gen) < 0.5
    elif dtype.is_floating_point:
        if low is not None:
            t = (torch.rand(shape, generator=gen, dtype=torch.float64) * (high - low) + low)
        else:
            t = torch.randn(shape, generator=gen, dtype=torch.float64)
        t = t.to(dtype)
    else:
        lo = -5 if low is None else low
        hi = 6 if high is None else high
        t = torch.randint(lo, hi, shape, generator=gen, dtype=dtype)
    return t.requires_grad_(requires_grad) if requires_grad else t


class Rng:
    """Per-test source of deterministic inputs (different tensors on each call)."""

    def __init__(self, name: str):
        self.gen = torch.Generator().manual_seed(seed_for(name))

    def __call__(self, *shape, **kw):
        return rand(*shape, gen=self.gen, **kw)

    def g(self, *shape, **kw):
        """A float tensor that requires grad."""
        return rand(*shape, gen=self.gen, requires_grad=True, **kw)


def check_factory(fn: Callable, rtol: float = RTOL, atol: float = ATOL,
                  compare: Optional[Callable] = None) -> Result:
    """Runs ``fn(device)`` with the CPU and with the spmd device and compares the results."""
    before = eager_counters()
    cpu_out = fn(torch.device("cpu"))
    dev_out = fn(DEV)
    eager = eager_ops_since(before)
    ops = recorded_ops([t for t in tree_leaves(dev_out) if isinstance(t, torch.Tensor)]) | eager
    if compare is not None:
        compare(dev_out, cpu_out)
    else:
        assert_same(dev_out, cpu_out, rtol, atol, "output")
    return Result(cpu_out, dev_out, ops, eager)


def same_shape_dtype(dev_out, cpu_out):
    """For random outputs: only structure, device, shape and dtype must agree."""
    for d, c in zip(tree_leaves(dev_out), tree_leaves(cpu_out), strict=True):
        assert d.device == DEV and d.shape == c.shape and d.dtype == c.dtype, (d, c)
        assert torch.isfinite(d.cpu()).all()


def sgd_losses(model: torch.nn.Module, loss_fn: Callable[[], torch.Tensor], steps: int,
               lr: float) -> torch.Tensor:
    """`steps` SGD steps of `loss_fn()` on `model` (a mark_step after each when it lives on the
    spmd device); the losses, on the CPU."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    on_spmd = next(model.parameters()).device.type == "spmd"
    losses = []
    for _ in range(steps):
        loss = loss_fn()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if on_spmd:
            xm.mark_step()
        losses.append(loss.detach().cpu())
    return torch.stack(losses)
