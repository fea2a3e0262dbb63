"""Differential testing of the partitioner: run one function eagerly on CPU and on the spmd
device with given input shardings, and compare outputs (and gradients) exactly enough to catch
any partitioning mistake.

    from spmd_diff import check, mesh_of, constrain

    def f(x, w):
        return constrain(x @ w, ("data", None)).relu()

    r = check(f, [torch.randn(10, 6), torch.randn(6, 4)], [("data", "model"), ("model", None)],
              mesh_of((4, 2)), grad=True, fwd=[("all-reduce", ("model",))])

The device run:
- uploads each input and lays it out with ``mark_sharding`` (spec None = replicated);
- by default *poisons the padding* of unevenly sharded inputs (NaN for floats, a large value
  for integers) through ``_load_local_shards``: the padded tail of a shard is unspecified, so
  any op that reads it without masking shows up as a NaN or a wrong value;
- runs ``fn`` (``constrain(t, spec)`` inside it adds a sharding constraint on the device and
  does nothing on CPU), executes the step (``torch_spmd.sync()``) and records
  ``last_step_stats()`` of the forward step;
- with ``grad``, differentiates with ``torch.autograd.grad`` against fixed random cotangents
  (the same on both sides), executes that as a second step and records its statistics.

Collective expectations are lists of ``(kind, axes)`` pairs compared in order, or callables that
get the list of collective dicts.
"""
import gc
import os

os.environ.setdefault("SPMD_NUM_DEVICES", "8")

from dataclasses import dataclass, field  # noqa: E402
from typing import Any, Callable, List, Optional, Sequence  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

import torch_spmd  # noqa: E402
import torch_spmd.distributed.spmd as xs  # noqa: E402
import torch_spmd.runtime as xr  # noqa: E402
from torch_spmd import _C  # noqa: E402
from torch_spmd.debug import metrics  # noqa: E402

N = 8

# Axis names per mesh shape used across the suite.
MESH_AXES = {
    (8,): ("x",),
    (4, 2): ("data", "model"),
    (2, 4): ("data", "model"),
    (1, 8): ("data", "model"),
    (8, 1): ("data", "model"),
    (2, 2, 2): ("a", "b", "c"),
}

_state = {"mesh": None}


def ensure_devices(n: int = N) -> None:
    if xr.global_runtime_device_count() != n:
        gc.collect()
        xr.configure_devices(n, "16GiB")
    xr.use_spmd()


def mesh_of(shape, names=None, device_ids=None) -> xs.Mesh:
    shape = tuple(shape)
    names = tuple(names) if names is not None else MESH_AXES[shape]
    ids = np.arange(N) if device_ids is None else np.asarray(device_ids)
    return xs.Mesh(ids, shape, names)


def dev():
    return torch_spmd.device()


def current_mesh() -> Optional[xs.Mesh]:
    return _state["mesh"]


def constrain(t: torch.Tensor, spec) -> torch.Tensor:
    """A sharding constraint on an intermediate when running on the device; identity on CPU."""
    if torch_spmd.is_spmd_tensor(t):
        mesh = current_mesh()
        assert mesh is not None, "constrain() outside a device run"
        xs.mark_sharding(t, mesh, tuple(spec))
    return t


def _poison_value(dtype: torch.dtype):
    if dtype.is_floating_point or dtype.is_complex:
        return float("nan")
    if dtype == torch.bool:
        return True
    return 1 << 20 if dtype not in (torch.int8, torch.uint8, torch.int16) else 77


def poison_padding(t: torch.Tensor) -> bool:
    """Fills the padding of every shard of device data ``t`` with garbage; returns whether it
    had any padding."""
    shards = _C._local_shards(t)
    padded = False
    out = []
    for device, data, offsets, lengths, _ in sorted(shards, key=lambda s: s[0]):
        data = data.clone()
        for d, length in enumerate(lengths):
            if length < data.shape[d]:
                padded = True
                data.narrow(d, length, data.shape[d] - length).fill_(_poison_value(data.dtype))
        out.append(data)
    if padded:
        _C._load_local_shards(t, out)
    return padded


def to_device(x: torch.Tensor, mesh: xs.Mesh, spec, poison: bool = True) -> torch.Tensor:
    """``x`` on the device laid out as ``spec`` (None = replicated), padding poisoned."""
    t = x.detach().to(dev())
    if spec is not None:
        xs.mark_sharding(t, mesh, tuple(spec))
        if poison:
            poison_padding(t)
    return t


def collectives(stats) -> List[tuple]:
    return [(c["kind"], tuple(c["axes"])) for c in stats["collectives"]]


def step(tensors: Sequence[torch.Tensor]) -> dict:
    """Executes everything pending (one step) and returns its statistics; an empty record when
    nothing had to run."""
    before = metrics.counter_value("ExecuteGraph") or 0
    torch_spmd.sync()
    after = metrics.counter_value("ExecuteGraph") or 0
    if after == before:
        return {"collectives": [], "replicated_fallback_ops": {}, "peak_bytes_per_device": 0,
                "flops_per_device": 0.0}
    return torch_spmd.debug.last_step_stats()


def _flatten(out) -> List[Any]:
    if isinstance(out, (tuple, list)):
        res = []
        for o in out:
            res.extend(_flatten(o))
        return res
    return [out]


def _differentiable(x) -> bool:
    return isinstance(x, torch.Tensor) and x.dtype.is_floating_point


@dataclass
class Run:
    cpu_out: List[Any]
    dev_out: List[Any]
    cpu_grads: List[Optional[torch.Tensor]] = field(default_factory=list)
    dev_grads: List[Optional[torch.Tensor]] = field(default_factory=list)
    fwd_stats: dict = field(default_factory=dict)
    bwd_stats: Optional[dict] = None
    program: Optional[str] = None

    @property
    def fwd(self) -> List[tuple]:
        return collectives(self.fwd_stats)

    @property
    def bwd(self) -> List[tuple]:
        return collectives(self.bwd_stats) if self.bwd_stats is not None else []


def run(fn: Callable, inputs: Sequence[Any], specs: Sequence[Any], mesh: xs.Mesh,
        grad=False, poison: bool = True, seed: int = 0, program: bool = False) -> Run:
    """Runs ``fn(*inputs)`` on CPU and on the device. ``specs[i]`` is the partition spec of
    tensor input i (None: replicated; non-tensor inputs pass through unchanged). ``grad``: True
    (every floating input), or a list of input indices to differentiate with respect to."""
    ensure_devices()
    inputs = list(inputs)
    specs = list(specs) + [None] * (len(inputs) - len(specs))
    if grad is True:
        wrt = [i for i, x in enumerate(inputs) if _differentiable(x)]
    elif grad:
        wrt = list(grad)
    else:
        wrt = []

    # CPU reference.
    cpu_in = [x.detach().clone().requires_grad_(i in wrt) if isinstance(x, torch.Tensor) else x
              for i, x in enumerate(inputs)]
    cpu_out = _flatten(fn(*cpu_in))
    gen = torch.Generator().manual_seed(seed)
    cot = [torch.randn(o.shape, dtype=o.dtype, generator=gen) if _differentiable(o) and o.requires_grad
           else None for o in cpu_out]
    cpu_grads = []
    if wrt:
        pairs = [(o, c) for o, c in zip(cpu_out, cot) if c is not None]
        cpu_grads = list(torch.autograd.grad([o for o, _ in pairs], [cpu_in[i] for i in wrt],
                                             [c for _, c in pairs], allow_unused=True))

    # Device run.
    gc.collect()
    _state["mesh"] = mesh
    try:
        dev_in = []
        for i, (x, spec) in enumerate(zip(inputs, specs)):
            if isinstance(x, torch.Tensor):
                t = to_device(x, mesh, spec, poison)
                if i in wrt:
                    t.requires_grad_(True)
                dev_in.append(t)
            else:
                dev_in.append(x)
        step([])  # uploads and layouts are done before the measured step
        out = _flatten(fn(*dev_in))
        text = None
        if program:
            text = torch_spmd.debug.partitioned_program(
                [o for o in out if torch_spmd.is_spmd_tensor(o)])
        fwd_stats = step(out)
        dev_out = [o.detach().cpu() if torch_spmd.is_spmd_tensor(o) else o for o in out]
        bwd_stats = None
        dev_grads = []
        if wrt:
            pairs = [(o, c) for o, c in zip(out, cot) if c is not None]
            grads = torch.autograd.grad([o for o, _ in pairs], [dev_in[i] for i in wrt],
                                        [c.to(dev()) for _, c in pairs], allow_unused=True)
            bwd_stats = step(grads)
            dev_grads = [g.cpu() if g is not None else None for g in grads]
    finally:
        _state["mesh"] = None
    cpu_out = [o.detach() if isinstance(o, torch.Tensor) else o for o in cpu_out]
    return Run(cpu_out, dev_out, cpu_grads, dev_grads, fwd_stats, bwd_stats, text)


def tolerances(dtype: torch.dtype):
    if dtype == torch.float64:
        return 1e-9, 1e-9
    if dtype in (torch.float16, torch.bfloat16):
        return 1e-2, 1e-2
    return 2e-5, 2e-5


def assert_same(actual, expected, what: str, rtol=None, atol=None) -> None:
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{what}: expected a tensor, got {type(actual)}"
        assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
        assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
        if expected.dtype.is_floating_point:
            r, a = tolerances(expected.dtype)
            torch.testing.assert_close(actual, expected, rtol=rtol or r, atol=atol or a,
                                       equal_nan=True, msg=lambda m: f"{what}: {m}")
        else:
            assert torch.equal(actual, expected), f"{what}: {actual} != {expected}"
    elif expected is None:
        assert actual is None, f"{what}: expected None"
    else:
        assert actual == expected, f"{what}: {actual} != {expected}"


def _check_collectives(stats, expected, what: str) -> None:
    if expected is None:
        return
    got = collectives(stats)
    if callable(expected):
        assert expected(stats["collectives"]), f"{what}: unexpected collectives {got}"
    else:
        expected = [(k, tuple(a)) for k, a in expected]
        assert got == expected, f"{what}: collectives {got} != {expected}"


def check(fn: Callable, inputs: Sequence[Any], specs: Sequence[Any], mesh: xs.Mesh, grad=False,
          rtol=None, atol=None, fwd=None, bwd=None, fallback_ok=False, poison: bool = True,
          seed: int = 0) -> Run:
    """``run`` plus assertions: outputs and gradients equal CPU's; ``fwd``/``bwd`` (when given)
    are the exact collectives of the forward/backward steps; no replicated fallback unless
    ``fallback_ok``."""
    r = run(fn, inputs, specs, mesh, grad=grad, poison=poison, seed=seed)
    assert len(r.dev_out) == len(r.cpu_out)
    for i, (a, e) in enumerate(zip(r.dev_out, r.cpu_out)):
        assert_same(a, e, f"output {i}", rtol, atol)
    for i, (a, e) in enumerate(zip(r.dev_grads, r.cpu_grads)):
        assert_same(a, e, f"grad {i}", rtol, atol)
    _check_collectives(r.fwd_stats, fwd, "forward")
    if r.bwd_stats is not None:
        _check_collectives(r.bwd_stats, bwd, "backward")
    if not fallback_ok:
        assert not r.fwd_stats["replicated_fallback_ops"], \
            f"forward fell back: {r.fwd_stats['replicated_fallback_ops']}"
        if r.bwd_stats is not None:
            assert not r.bwd_stats["replicated_fallback_ops"], \
                f"backward fell back: {r.bwd_stats['replicated_fallback_ops']}"
    return r


def no_collectives(cs) -> bool:
    return not cs


def only(*kinds):
    """Collective predicate: every collective is one of ``kinds``."""
    return lambda cs: all(c["kind"] in kinds for c in cs)


# Specs over each mesh for a 2-D tensor, uneven-friendly (used by many rule tests).
SPECS_2D = {
    (8,): [("x", None), (None, "x"), (None, None)],
    (4, 2): [("data", "model"), ("model", "data"), ("data", None), (None, "model"),
             (("data", "model"), None), (None, ("model", "data"))],
    (2, 2, 2): [("a", ("b", "c")), (("c", "a"), "b"), ("b", None), (None, ("a", "b", "c"))],
}
MESH_SHAPES = [(8,), (4, 2), (2, 2, 2)]
