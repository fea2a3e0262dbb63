"""Auto-sharding: plan mode chooses the partition specs.

  >>> def build():                       # called inside the plan: nothing is allocated
  ...     model = GPT(cfg).to("spmd")
  ...     idx = torch.zeros(64, 1024, dtype=torch.long, device="spmd")
  ...     return model, torch.optim.AdamW(model.parameters()), (idx,)
  >>> def step(model, opt, idx):         # one training step, without mark_step
  ...     model.loss(idx, idx).backward(); opt.step(); opt.zero_grad()
  >>> result = auto_shard(build, step, num_devices=64, hardware="tpu-v5p", time_limit=30)
  >>> print(result)                      # the chosen layout, its plan, the runners-up
  >>> print(result.mark_sharding_lines())
  >>> mesh = result.apply(model, inputs=(idx,))   # the same specs on a real model

What is searched. The step is recorded once; the ops' sharding rules tie the dims of its
parameters and inputs into classes (``_C._pending_dim_classes``, plan/dim_classes.h: the
batch, the model width, each MLP's hidden dim with both of its weights, ...), the logical axes a
MaxText user would name by hand. A layout gives every class an ordered tuple of the axes of a
2-D mesh ``(data, model)`` (or none), and every parameter group a storage choice: a dim and the
axes it is stored over beyond its class's (FSDP), or none. With ``tie_blocks`` (default) repeated
blocks are one decision (``h.3.mlp.fc.weight`` / ``h.7.mlp.fc.weight``). Optimizer states follow
their parameter. Data parallelism, FSDP, Megatron's column/row pairs, sequence sharding and their
2-D combinations are all points of this space; every mesh factorisation is tried.

How it is costed. Each candidate layout is applied to the planned tensors and the step is
planned for real (propagation, partitioning, the step-time model and the memory timeline: the
same numbers as ``Plan.report()``), so a layout is never better on paper than in its own plan.
A layout whose peak exceeds ``memory_budget`` loses to every one that fits.

How it searches. Seeds (``_seeds``): data parallelism and FSDP over every device, and per mesh
shape with a model axis tensor parallelism (the batch over 'data', the parameter-only classes
over 'model' where no tensor uses it twice: Megatron's pairs), with and without FSDP over
'data'. From each seed, best first, coordinate descent: one decision at a time takes each other
option, and a change that lowers the predicted step (or the peak, while nothing fits) is kept,
until a sweep changes nothing or ``time_limit`` runs out. Then the best few layouts are planned
again exactly (``evaluate_specs(exact=True)``: fresh tensors, two steps, as a run has them) and
the best of those is returned. It is a local search against the exact plan, not an exact
optimum (docs/plan_mode.md).
"""
import contextlib
import gc
import itertools
import math
import re
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from .. import _C
from . import auto_shard_ilp
from ..distributed.spmd._partition_spec import normalize

__all__ = ["auto_shard", "plan_layouts", "AutoShardResult", "Layout"]

Spec = Tuple  # a partition spec: per dim None, an axis name, or a tuple of axis names


@dataclass
class Layout:
    """One evaluated layout: a mesh shape and every parameter's and input's spec, with its
    plan's predicted step time and peak memory per device."""
    mesh_shape: Tuple[int, ...]
    axis_names: Tuple[str, ...]
    param_specs: Dict[str, Spec]
    input_specs: List[Spec]
    predicted_step_seconds: float
    peak_bytes: int
    fits: bool
    # its plan report (Plan.report()); None for the search's own evaluations (not `exact`),
    # which keep only the step and the peak
    report: object = field(default=None, repr=False)
    exact: bool = False  # planned as a training run has it (evaluate_specs)
    # seconds into the call when the search first planned this layout (an exact re-plan keeps
    # its source's): how long the search took to find it, whatever its time limit
    found_after: float = 0.0
    marked_elements: int = 0  # of the parameters its specs shard (_rank's last tie-break)

    def describe(self) -> str:
        mesh = " x ".join(f"{n}={s}" for n, s in zip(self.axis_names, self.mesh_shape))
        return (f"mesh ({mesh}): step {self.predicted_step_seconds * 1e3:.2f} ms, peak "
                f"{self.peak_bytes / 2**30:.2f} GiB{'' if self.fits else ' (over budget)'}")


@dataclass
class AutoShardResult:
    """What ``auto_shard`` found: ``best`` and the next best layouts (``runners_up``: the
    other exactly re-planned ones, best first, then the rest of what the search planned, best
    first by the search's figures), with how many layouts were planned and how long it took."""
    best: Layout
    runners_up: List[Layout]
    evaluations: int
    seconds: float
    timed_out: bool
    classes: List[List[Tuple[str, int]]]  # per decision: the (tensor, dim) it shards
    # per mesh shape solved, the layout ILP (auto_shard_ilp.IlpResult), in the order solved
    ilp: List = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"auto_shard: {self.evaluations} layouts planned in {self.seconds:.1f} s"
                 f"{' (time limit reached)' if self.timed_out else ''}",
                 f"  best:      {self.best.describe()} (found after "
                 f"{self.best.found_after:.1f} s)"]
        # (runners-up that read as the best does differ only in specs the cost cannot tell
        # apart, e.g. which of two equal axes a bias is stored over: listed once, counted)
        shown, same = [self.best.describe()], 0
        for r in self.runners_up:
            if r.describe() in shown:
                same += 1
            elif len(shown) < 5:
                shown.append(r.describe())
                lines.append(f"  runner-up: {shown[-1]}")
        if same:
            lines.append(f"  ({same} more layouts read the same as one above: they differ in "
                         f"specs that cost the same)")
        return "\n".join(lines + ["", self.mark_sharding_lines()])

    def mark_sharding_lines(self, model: str = "model", mesh: str = "mesh") -> str:
        """The layout as the lines a user would write (repeated blocks as one loop)."""
        b = self.best
        lines = [f"{mesh} = xs.Mesh(np.arange({math.prod(b.mesh_shape)}), {b.mesh_shape}, "
                 f"{b.axis_names})"]
        by_pattern: Dict[Tuple[str, Spec], List[str]] = {}
        for name, spec in b.param_specs.items():
            if not _has_axes(spec):
                continue
            pattern = _BLOCK_INDEX.sub(".{i}.", name)
            by_pattern.setdefault((pattern, spec), []).append(name)
        for (pattern, spec), names in by_pattern.items():
            one_index = len(names) > 1 and pattern.count("{i}") == 1
            blocks = [int(_BLOCK_INDEX.search(n).group()[1:-1]) for n in names] if one_index else []
            if one_index and \
                    blocks == list(range(blocks[0], blocks[0] + len(names))):
                lines.append(f"for i in range({blocks[0]}, {blocks[-1] + 1}):\n    xs.mark_sharding("
                             f"{model}.get_parameter(f{pattern!r}), {mesh}, {spec!r})")
            else:
                lines += [f"xs.mark_sharding({model}.get_parameter({n!r}), {mesh}, {spec!r})"
                          for n in names]
        for i, spec in enumerate(b.input_specs):
            if _has_axes(spec):
                lines.append(f"xs.mark_sharding(inputs[{i}], {mesh}, {spec!r})")
        return "\n".join(lines)

    def apply(self, model: torch.nn.Module, inputs: Sequence[torch.Tensor] = ()):
        """Marks the chosen specs on ``model``'s parameters and on ``inputs`` (spmd tensors of
        the shapes planned); returns the mesh they are marked on."""
        from ..distributed.spmd.xla_sharding import mark_sharding
        b = self.best
        mesh = _make_mesh(b.mesh_shape, b.axis_names)
        params = dict(model.named_parameters())
        missing = sorted(set(b.param_specs) - set(params))
        if missing:
            raise ValueError(f"apply: the model has no parameter {missing[0]!r} (the layout was "
                             f"found for a model with {len(b.param_specs)} parameters)")
        for name, spec in b.param_specs.items():
            if _has_axes(spec):
                mark_sharding(params[name], mesh, spec)
        if len(inputs) not in (0, len(b.input_specs)):
            raise ValueError(f"apply: expected {len(b.input_specs)} inputs, got {len(inputs)}")
        for t, spec in zip(inputs, b.input_specs):
            if _has_axes(spec):
                mark_sharding(t, mesh, spec)
        return mesh


_BLOCK_INDEX = re.compile(r"\.\d+\.")


def _has_axes(spec: Spec) -> bool:
    """Whether a spec shards anything (one without axes is left unannotated, as by apply)."""
    return any(a is not None for a in spec)


def _make_mesh(shape, names):
    from ..distributed.spmd import mesh as mesh_mod
    return mesh_mod.Mesh(np.arange(math.prod(shape)), tuple(shape), tuple(names))


def _hardware_and_budget(hardware, memory_budget):
    """The resolved preset and the bytes per device a layout may peak at."""
    from . import resolve
    hw = resolve(hardware)
    budget = float(hw["hbm_bytes"]) if memory_budget is None else float(memory_budget)
    if not budget > 0:
        raise ValueError(f"auto_shard: memory_budget must be a positive number of bytes, "
                         f"got {memory_budget!r}")
    return hw, budget


def _mesh_shapes(n: int) -> List[Tuple[int, int]]:
    """(data, model) factorisations of n, data parallel first."""
    return [(n // m, m) for m in range(1, n + 1) if n % m == 0]


def _axis_tuples(axes: Sequence[Tuple[str, int]]) -> List[Tuple[str, ...]]:
    """Every ordered tuple of distinct axes (of size > 1), the empty one first."""
    names = [a for a, size in axes if size > 1]
    out = [()]
    for r in range(1, len(names) + 1):
        out += list(itertools.permutations(names, r))
    return out


def _fits_tiles(names, shape, axes, size) -> bool:
    # (tiles may be uneven, padded as the partitioner pads them: a 50257-row vocabulary is
    # still worth sharding; a dim smaller than the tiles is not)
    return size >= math.prod(dict(zip(names, shape))[a] for a in axes)


def _options(search, names, shape, sizes, i) -> list:
    """Decision i's options on a mesh of `shape`: for a class (i < its count), the axis tuples
    every dim of it (`sizes[i]`) can be tiled over, () first; for a storage group, None (as its
    classes lay it out) or (dim, axes) beyond them (FSDP)."""
    tuples = _axis_tuples(list(zip(names, shape)))
    nc = len(search.classes)
    if i >= nc:
        p = search.params[search.groups[i - nc][0]][1]
        return [None] + [(d, t) for d in range(p.dim()) for t in tuples[1:]
                         if _fits_tiles(names, shape, t, p.shape[d])]
    return [t for t in tuples if all(_fits_tiles(names, shape, t, d) for d in sizes[i])]


def _ilp_costs(search, names, shape, hw):
    """The layout ILP's coefficients (auto_shard_ilp) of the step on a mesh of `shape`, and
    the number of options of each decision."""
    sizes = search.sizes()[0]
    nc = len(search.classes)
    index = {a: k for k, a in enumerate(names)}

    def encoded(i, option):  # (dim, axis indices): a class's axes, or a storage choice
        if i < nc:
            return (-1, [index[a] for a in option])
        return (-1, []) if option is None else (option[0], [index[a] for a in option[1]])

    options = [[encoded(i, o) for o in _options(search, names, shape, sizes, i)]
               for i in range(nc + len(search.groups))]

    def while_pending(leaf_ids, state_ids):
        # The graph's classes (numbered afresh) to the search's decisions, through the leaves.
        found = _C._pending_dim_classes()
        decision_of_class = {}
        for data, dims in zip(leaf_ids, search.dims):
            for c, j in zip(found.get(data, []), dims):
                if c >= 0 and j >= 0:
                    decision_of_class[c] = j
        every = max((c for dims in found.values() for c in dims), default=-1) + 1
        group_of = {i: g for g, members in enumerate(search.groups) for i in members}
        storage = {leaf_ids[i]: nc + g for i, g in group_of.items()}
        storage.update({data: nc + group_of[i] for (_, i), data in zip(search.states, state_ids)
                        if i >= 0})
        return _C._pending_layout_costs(
            list(shape), [decision_of_class.get(c, -1) for c in range(every)], options,
            storage, dict(hw), _ILP_MEMORY_ROWS)

    return search.record(while_pending), [len(o) for o in options]


# Points of the step whose live bytes the ILP bounds by the budget (the most bytes first).
_ILP_MEMORY_ROWS = 6
# The ILP is solved on the mesh shapes of this many of the best seeds (each a recorded step,
# coefficients computed in C++ and a HiGHS solve), within this share of the time limit.
_ILP_SHAPES = 2
_ILP_SHARE = 0.1
# ... where the time limit affords at least this many evaluations at their mean cost so far.
_ILP_MIN_EVALUATIONS = 40


class _Search:
    """The planned model, its leaves (parameters, optimizer states, inputs), its classes,
    and the cache of evaluated layouts."""

    def __init__(self, build, step, plan, budget, tie_blocks, started=None):
        from ..core import xla_model as xm
        self.xm, self.plan, self.budget, self.step, self.build = xm, plan, budget, step, build
        self._meshes, self._dim_axes = {}, {}
        self._last_specs = None  # ((mesh shape, names), specs) of the last evaluation
        self.fitting_found = False  # some evaluated layout fits the budget
        self.started = time.perf_counter() if started is None else started  # (found_after)
        self._build()
        self.states, self.classes, self.dims = [], [], []
        self.groups = self._storage_groups(tie_blocks)
        self.cache: Dict[tuple, Layout] = {}

    def find_classes(self, tie_blocks):
        """Sets the decisions' classes (see _classes). (plan_layouts plans only exactly: each
        evaluation starts afresh, without classes.)"""
        # A first step makes the optimizer's state (steady state is what is planned).
        self._run()
        self.states = self._optimizer_states()
        self._classes(tie_blocks)

    def record(self, while_pending):
        """Records one more step as the tensors are laid out now and returns
        `while_pending(leaf_ids, state_ids)`, called before it is planned (the data ids of the
        parameters and inputs, and of the optimizer states). The step is the last evaluation's
        again: plan mode finds its program in its cache."""
        leaf_ids = [_C._data_id(t) for _, t in self.params] + \
            [_C._data_id(t) for t in self.inputs]
        state_ids = [_C._data_id(v) for v, _ in self.states]
        self.step(self.model, self.opt, *self.inputs)
        try:
            return while_pending(leaf_ids, state_ids)
        finally:
            self.xm.mark_step()

    def _storage_groups(self, tie_blocks):
        """Parameters whose storage is decided together: one block's parameter and the same
        parameter of every other block (with ``tie_blocks``), each parameter alone otherwise."""
        groups: Dict[tuple, List[int]] = {}
        for i, (name, p) in enumerate(self.params):
            key = (_BLOCK_INDEX.sub(".*.", name) if tie_blocks else name, tuple(p.shape))
            groups.setdefault(key, []).append(i)
        return list(groups.values())

    def _mesh(self, shape, names):
        """The mesh of `shape` and its part of ``_C._set_shardings``'s arguments (device ids,
        shape, axis names), made once."""
        if (shape, names) not in self._meshes:
            mesh = _make_mesh(shape, names)
            self._meshes[shape, names] = mesh, mesh._sharding_args((None,))[:3]
        return self._meshes[shape, names]

    def _build(self):
        self.model, self.opt, inputs = self.build()
        self.inputs = tuple(inputs)
        self.params = [(n, p) for n, p in self.model.named_parameters()]
        self._check_spmd()
        # Made by factories, the inputs would be computed inside the first step, in whatever
        # layout propagation gives them; a run's batches arrive as data.
        self.xm.mark_step()

    def _check_spmd(self):
        for name, t in [(n, p) for n, p in self.params] + \
                [(f"inputs[{i}]", t) for i, t in enumerate(self.inputs)]:
            if not isinstance(t, torch.Tensor) or t.device.type != "spmd":
                raise ValueError(f"auto_shard: build() must return spmd tensors; {name} is "
                                 f"{type(t).__name__ if not isinstance(t, torch.Tensor) else t.device}")

    def _run(self):
        self.step(self.model, self.opt, *self.inputs)
        self.xm.mark_step()

    def _optimizer_states(self):
        """(state tensor, index of its parameter or -1) for every tensor state."""
        if self.opt is None:
            return []
        index = {id(p): i for i, (_, p) in enumerate(self.params)}
        out = []
        for p, st in self.opt.state.items():
            for v in st.values():
                if isinstance(v, torch.Tensor) and v.device.type == "spmd":
                    same = v.shape == p.shape
                    out.append((v, index.get(id(p), -1) if same else -1))
        return out

    def _classes(self, tie_blocks):
        """Sets per decision the (leaf, dim) members (self.classes) and per leaf the decision
        of each dim (self.dims; -1: none)."""
        leaves = [n for n, _ in self.params] + [f"inputs[{i}]" for i in range(len(self.inputs))]
        tensors = [p for _, p in self.params] + list(self.inputs)
        ids, found = self.record(lambda leaf_ids, _: (leaf_ids, _C._pending_dim_classes()))
        self._decide(found, leaves, tensors, ids, tie_blocks)

    def _decide(self, found, leaves, tensors, ids, tie_blocks):
        members: Dict[int, List[Tuple[str, int]]] = {}
        leaf_dims = []
        for name, t, i in zip(leaves, tensors, ids):
            dims = found.get(i, [-1] * t.dim())           # a leaf the step does not read
            leaf_dims.append(dims)
            for d, c in enumerate(dims):
                if c >= 0:
                    members.setdefault(c, []).append((name, d))
        # Tie classes whose members differ only in a block index.
        key_of = {}
        for c, m in members.items():
            key = frozenset((_BLOCK_INDEX.sub(".*.", n), d) for n, d in m) if tie_blocks else c
            key_of[c] = key
        keys = list(dict.fromkeys(key_of[c] for c in sorted(members)))
        decision = {k: i for i, k in enumerate(keys)}
        classes = [[] for _ in keys]
        for c, m in members.items():
            classes[decision[key_of[c]]] += m
        self.dims = [[decision[key_of[c]] if c >= 0 else -1 for c in ds] for ds in leaf_dims]
        self.classes = classes

    def param_bytes(self) -> List[int]:
        return [p.numel() * p.element_size() for _, p in self.params]

    def sizes(self):
        """Per decision: the sizes of its dims, and the parameter bytes it touches."""
        shapes = {n: p.shape for n, p in self.params}
        shapes.update({f"inputs[{i}]": t.shape for i, t in enumerate(self.inputs)})
        nbytes = dict(zip((n for n, _ in self.params), self.param_bytes()))
        return ([[shapes[n][d] for n, d in m] for m in self.classes],
                [sum(nbytes.get(n, 0) for n, _ in m) for m in self.classes])

    def specs(self, choice) -> Optional[List[Spec]]:
        """Per leaf its spec under `choice`: the axes of each dim's class, then, for a
        parameter, the storage axes of its group on their dim (FSDP). None where a leaf would
        use a mesh axis twice."""
        nc = len(self.classes)
        storage = {}
        for g, members in enumerate(self.groups):
            for i in members:
                storage[i] = choice[nc + g]
        out = []
        for i, dims in enumerate(self.dims):
            axes_of = [tuple(choice[c]) if c >= 0 else () for c in dims]
            if storage.get(i):
                d, extra = storage[i]
                axes_of[d] = axes_of[d] + tuple(extra)
            flat = [a for axes in axes_of for a in axes]
            if len(flat) != len(set(flat)):
                return None
            out.append(tuple(None if not a else a[0] if len(a) == 1 else a for a in axes_of))
        return out

    def evaluate(self, mesh_shape, names, choice) -> Optional[Layout]:
        """The layout giving each decision the axes in `choice`, planned (cached)."""
        specs = self.specs(choice)
        return None if specs is None else self.evaluate_specs(mesh_shape, names, specs)

    def evaluate_specs(self, mesh_shape, names, specs, exact=False) -> Optional[Layout]:
        """Plans the step with `specs` (per parameter, then per input) on a mesh of
        `mesh_shape`; None when the step cannot run in that layout. Cached.

        The search's evaluation re-lays out the tensors of the previous one, gives each
        optimizer state its parameter's spec and plans one step. A real run marks fresh
        tensors, and its states take whatever layout the step that creates them gives them (a
        replicated bias's Adam moments come out sharded like its reduce-scattered gradient).
        So an `exact` evaluation builds the model, optimizer and inputs again, marks them and
        plans two steps, as a training run starts: the second, steady-state step is reported.
        It costs a build and two steps; auto_shard uses it to re-rank its best layouts."""
        key = (tuple(mesh_shape), tuple(names), tuple(specs), exact)
        if key in self.cache:
            return self.cache[key]
        if not exact and self.fitting_found and \
                self._resident_lower_bound(mesh_shape, names, specs) > self.budget:
            return None  # (cannot fit, and a layout that fits is known: not worth a plan)
        mesh, mesh_args = self._mesh(tuple(mesh_shape), tuple(names))
        if exact:
            # (the old tensors go first: still held, they would count as live beside the step)
            self.model = self.opt = self.inputs = self.params = self.states = None
            gc.collect()
            self._build()
        tensors = [p for _, p in self.params] + list(self.inputs)
        pairs = list(zip(tensors, specs))
        if not exact:
            # An optimizer state starts in its parameter's spec, or, where that spec is the
            # previous evaluation's on the same mesh, as that step left it: most often its
            # steady state already (a descent changes one decision at a time), which saves
            # planning the step twice. The check below catches a state that was not.
            last = self._last_specs if self._last_specs and self._last_specs[0] == key[:2] \
                else None
            pairs += [(v, specs[i] if i >= 0 else (None,) * v.dim()) for v, i in self.states
                      if last is None or (i >= 0 and last[1][i] != specs[i])]
        self._last_specs = None if exact else (key[:2], tuple(specs))
        dim_axes = []  # (xs.mark_sharding's checks, once per spec)
        for _, spec in pairs:
            on = (mesh.mesh_shape, mesh.axis_names, spec)
            if on not in self._dim_axes:
                self._dim_axes[on] = mesh._sharding_args(normalize(spec))[3] \
                    if _has_axes(spec) else None
            dim_axes.append(self._dim_axes[on])
        _C._set_shardings([t for t, _ in pairs], *mesh_args, dim_axes)
        try:
            before = _C._sharding_fingerprints([v for v, _ in self.states]) if not exact else []
            self._run()
            # A state the step hands back in another layout than it was given (its gradient
            # is tiled otherwise) was not in the steady state: planned once more from there.
            if exact or before != _C._sharding_fingerprints([v for v, _ in self.states]):
                self._run()
        except (RuntimeError, ValueError):
            self._last_specs = None  # (the states may be left in any layout)
            self.cache[key] = None  # a layout the step cannot run in (counted as not found)
            return None
        finally:
            if exact:
                self.states = self._optimizer_states()
        # (the search's own evaluations keep the step and the peak: the whole report costs a
        # fifth of planning a 70B step)
        if exact:
            r = self.plan.report()
            step_seconds, peak = r.predicted_step_seconds, max(r.peak_bytes_per_device)
        else:
            r = None
            step_seconds, peak = _C._last_step_summary(self.plan.hardware)
        n = len(self.params)
        layout = Layout(tuple(mesh_shape), tuple(names),
                        {name: s for (name, _), s in zip(self.params, specs[:n])},
                        list(specs[n:]), step_seconds, peak, peak <= self.budget, r, exact,
                        time.perf_counter() - self.started,
                        sum(p.numel() for (_, p), s in zip(self.params, specs) if _has_axes(s)))
        self.cache[key] = layout
        self.fitting_found = self.fitting_found or layout.fits
        return layout

    def _resident_lower_bound(self, mesh_shape, names, specs) -> int:
        """Bytes per device the parameters, inputs and optimizer states alone hold under
        `specs` (each state laid out as its parameter): no step peaks lower."""
        size = dict(zip(names, mesh_shape))

        def tiles(spec):
            n = 1
            for axes in spec:
                for a in ((axes,) if isinstance(axes, str) else axes or ()):
                    n *= size[a]
            return n

        leaves = [p for _, p in self.params] + list(self.inputs)
        total = sum(t.numel() * t.element_size() // tiles(s) for t, s in zip(leaves, specs))
        return total + sum(v.numel() * v.element_size() // (tiles(specs[i]) if i >= 0 else 1)
                           for v, i in self.states)


@contextlib.contextmanager
def _gc_paused():
    """Python's cyclic collector off for a search: recording a step allocates enough objects to
    trigger it every few hundred ops, and it then walks the model's (5% of a 70B search). A
    search's cycles are few; the exact re-plans collect before they build."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _seeds(shapes, names, nc, ng, batch, model_classes, options, valid):
    """Sweeps of (mesh shape, choice) pairs to descend from, each one kind of layout over the
    shapes by growing model axis (see _plan_sweep), in the order to plan them. Data parallelism and FSDP (every parameter's
    dim 0 stored over the axes) over every device are one layout on any mesh shape: planned
    once, on the flattest shape. On a shape with a model axis, tensor parallelism: the batch
    over 'data', and the parameter-only classes (`model_classes`, most bytes first) over
    'model' wherever no tensor then uses it twice: for a transformer, Megatron's column/row
    pairs and a vocabulary-parallel embedding; with and without FSDP over 'data'."""
    out = []
    flattest = min(shapes, key=lambda s: s[1])
    data, model = names

    def set_if(choice, i, value, shape):
        trial = choice[:i] + [value] + choice[i + 1:]
        return trial if value in options(shape, i) and valid(trial) else choice

    def fsdp(choice, shape, axes):
        for g in range(nc, nc + ng):
            for d in range(2):  # dim 0, else dim 1 (when dim 0 is tensor-parallel)
                trial = set_if(choice, g, (d, axes), shape)
                if trial is not choice:
                    choice = trial
                    break
        return choice

    tp_fsdp, tp_only = [], []
    for shape in shapes:
        base = [()] * nc + [None] * ng
        every = tuple(a for a, size in zip(names, shape) if size > 1)
        if shape == flattest:
            dp = set_if(base, batch, every, shape) if batch >= 0 else base
            out += [(shape, dp), (shape, fsdp(dp, shape, every))]
        if shape[1] > 1:
            tp = set_if(base, batch, (data,), shape) if batch >= 0 and shape[0] > 1 else base
            for c in model_classes:
                tp = set_if(tp, c, (model,), shape)
            tp_only.append((shape, tp))
            if shape[0] > 1:
                tp_fsdp.append((shape, fsdp(tp, shape, (data,))))
    # Planned in this order (a large model's plan may leave time for few): the layouts that
    # store the least first; each sweep over the shapes by growing model axis.
    sweeps, seen = [], set()
    for sweep in (tp_fsdp, out, tp_only):
        unique = [(s, c) for s, c in sweep if (s, tuple(c)) not in seen]
        seen.update((s, tuple(c)) for s, c in unique)
        if unique:
            sweeps.append(unique)
    return sweeps


def _plan_sweep(search, names, sweep, out_of_time, best, patience=2):
    """Plans a sweep's seeds (one kind of layout over mesh shapes by growing model axis) and
    returns [(layout, shape, choice)], and whether time ran out (at least one layout is
    planned unless the search has a `best` already). Once some layout fits, a sweep stops
    after `patience` layouts in a row that rank behind the best so far: a wider model axis
    trades collectives per layer for memory, so past the best width a layout that fits is
    slower still, and one that does not fit gains nothing the FSDP sweep has not tried (on
    2048 chips this saves planning 32 x 64 .. 1 x 2048, seconds each for a 70B model). While
    nothing fits, a sweep goes on: stopping it after two layouts whose peak did not fall
    lost the 70B case on 2048 chips its best shape (1.007 of the hand layout's step, against
    0.995)."""
    found, worse = [], 0
    for shape, choice in sweep:
        if out_of_time() and best is not None:
            return found, True
        lay = search.evaluate(shape, names, choice)
        if lay is None:
            continue
        found.append((lay, shape, choice))
        if _better(lay, best):
            best, worse = lay, 0
        elif best.fits:
            worse += 1
            if worse >= patience:
                break
    return found, False


def _descend(search, shape, names, layout, choice, order, options, out_of_time) -> bool:
    """Coordinate descent from `choice` (planned as `layout`): one decision at a time takes
    each of its other `options`, and a change that ranks better is kept, until a sweep
    changes nothing. Returns whether it stopped because `out_of_time()`."""
    choice = list(choice)
    improved = True
    while improved:
        improved = False
        for c in order:
            for axes in options(c):
                if axes == choice[c]:
                    continue
                if out_of_time():
                    return True
                trial = choice[:c] + [axes] + choice[c + 1:]
                planned = search.evaluate(shape, names, trial)
                if _better(planned, layout):
                    layout, choice, improved = planned, trial, True
    return False


# An exact plan moves a layout's step by a few percent at most (its optimizer states' layouts);
# layouts slower than the search's best by more than this are not planned again.
_RERANK_MARGIN = 0.1


def _rerank(search, rerank, deadline):
    """The best few layouts the search planned, planned again exactly (each optimizer state
    in the layout a run gives it), decide: up to `rerank` of them, as many as the time left
    allows, and at least one; beyond them only while none fits and the search found one that
    does (planned exactly, a layout can peak higher), even past the deadline. Returns the
    best, the runners-up (the exact ones, then the search's) and whether time cut it short."""
    ranked = sorted((l for k, l in search.cache.items() if l is not None and not k[3]), key=_rank)
    exact, cost, cut = [], 0.0, False
    for i, l in enumerate(ranked):
        fitting = any(e is not None and e.fits for e in exact)
        if fitting and l.fits and ranked[0].fits and l.predicted_step_seconds > \
                (1 + _RERANK_MARGIN) * ranked[0].predicted_step_seconds:
            break  # (too far behind for the exact plan to change the order)
        if i >= rerank or (exact and time.perf_counter() + cost > deadline):
            if fitting or not l.fits:
                cut = i < rerank
                break
        t1 = time.perf_counter()
        e = search.evaluate_specs(
            l.mesh_shape, l.axis_names, list(l.param_specs.values()) + list(l.input_specs),
            exact=True)
        if e is not None:
            e.found_after = min(e.found_after, l.found_after)
        exact.append(e)
        cost = max(cost, time.perf_counter() - t1)
    replanned = len(exact)
    exact = sorted((l for l in exact if l is not None), key=_rank)
    if not exact:
        raise RuntimeError("auto_shard: none of the best layouts could be planned exactly")
    return exact[0], exact[1:] + ranked[replanned:], cut


def _better(a: Optional[Layout], b: Optional[Layout]) -> bool:
    """Whether a beats b: fitting first, then the predicted step (while nothing fits, the
    peak)."""
    if a is None:
        return False
    if b is None:
        return True
    return _rank(a) < _rank(b)


def _rank(a: Layout) -> tuple:
    """Sort key: layouts that fit first, by predicted step (equal steps to 1e-9: by peak,
    then the one that marks more parameter elements: a parameter left unmarked may be laid
    out by propagation as if marked, the same program, but the lines that say so are the
    ones to keep); then the others by peak."""
    if not a.fits:
        return (1, a.peak_bytes, 0.0, 0)
    return (0, round(a.predicted_step_seconds, 9), a.peak_bytes, -a.marked_elements)


def auto_shard(build: Callable, step: Callable, num_devices: int, hardware="tpu-v4",
               memory_budget: Optional[float] = None, time_limit: float = 60.0,
               mesh_shapes: Optional[Sequence[Tuple[int, int]]] = None,
               axis_names: Tuple[str, str] = ("data", "model"),
               tie_blocks: bool = True, rerank: int = 5, ilp: bool = True) -> AutoShardResult:
    """Chooses the partition specs of a training step (see the module docstring).

    Args:
        build: called once inside the plan; returns ``(model, optimizer or None, inputs)``
            with the model's parameters and the inputs (a tuple) on the spmd device.
        step: ``step(model, optimizer, *inputs)`` records one training step (forward, backward,
            optimizer), without ``mark_step``.
        num_devices: devices of the pod.
        hardware: a ``torch_spmd.plan`` preset name or dict.
        memory_budget: bytes per device a layout may peak at (default: the hardware's HBM).
        time_limit: seconds for the whole call (the exact re-planning of the best layouts
            included); the best layout found is returned when they run out.
        mesh_shapes: the ``(data, model)`` shapes to try (default: every factorisation).
        axis_names: the two mesh axes' names.
        tie_blocks: decide repeated blocks' parameters together.
        rerank: how many of the best layouts are planned again exactly (``evaluate_specs``)
            to choose among them, as many as the time limit leaves room for (at least one);
            the result's ``best`` and its report are exact.
        ilp: also solve the layout ILP per mesh shape (auto_shard_ilp; needs scipy >= 1.9)
            and descend from its solutions; ``result.ilp`` has each shape's objective, bound
            and gap.
    """
    if isinstance(rerank, bool) or not isinstance(rerank, int) or rerank < 1:
        raise ValueError(f"auto_shard: rerank must be a positive int, got {rerank!r}")
    from . import Plan
    if isinstance(num_devices, bool) or not isinstance(num_devices, int) or num_devices < 1:
        raise ValueError(f"auto_shard: num_devices must be a positive int, got {num_devices!r}")
    if not (isinstance(time_limit, (int, float)) and time_limit > 0):
        raise ValueError(f"auto_shard: time_limit must be a positive number of seconds, got {time_limit!r}")
    hw, budget = _hardware_and_budget(hardware, memory_budget)
    shapes = [tuple(s) for s in mesh_shapes] if mesh_shapes is not None else _mesh_shapes(num_devices)
    for s in shapes:
        if len(s) != 2 or math.prod(s) != num_devices:
            raise ValueError(f"auto_shard: mesh shape {tuple(s)!r} is not a (data, model) "
                             f"shape of {num_devices} devices")
    names = tuple(axis_names)
    if len(names) != 2 or len(set(names)) != 2 or not all(isinstance(a, str) for a in names):
        raise ValueError(f"auto_shard: axis_names must be two distinct names (data, model), "
                         f"got {axis_names!r}")
    t0 = time.perf_counter()
    deadline = t0 + time_limit
    with Plan(num_devices=num_devices, hardware=hw) as plan, _gc_paused():
        search = _Search(build, step, plan, budget, tie_blocks, started=t0)
        search.find_classes(tie_blocks)
        sizes, param_bytes = search.sizes()
        nc, ng = len(search.classes), len(search.groups)
        first_input = search.dims[len(search.params)] if search.inputs else []
        batch = first_input[0] if first_input else -1
        nbytes = search.param_bytes()
        group_bytes = [sum(nbytes[i] for i in g) for g in search.groups]
        # Classes by the parameter bytes they shard, the batch last: from a seed that leaves
        # the model axis to the parameters, the classes that can use it (Megatron's pairs)
        # move before the batch takes it back. Then the storage of each group, largest first.
        # Classes about less than 0.5% of the parameter bytes, no input dim and no matrix
        # (a bias's own dim) are left as the seed has them: each costs a planned step per
        # option and moves next to nothing. A small matrix's class stays: a 32000-word
        # vocabulary is 0.4% of a 70B model's bytes, but decides whether its logits and
        # embedding outputs are communicated. Every storage decision stays, the smallest last:
        # a small group stored sharded costs a collective's latency at every use (norm weights
        # gathered in each layer; a mixture's attention, a fraction of a percent of its bytes,
        # costs milliseconds of latency per step).
        total = sum(nbytes) or 1
        feeds_input = {c for dims in search.dims[len(search.params):] for c in dims if c >= 0}
        of_matrix = {c for dims, (_, p) in zip(search.dims, search.params) if p.dim() >= 2
                     for c in dims if c >= 0}
        order = sorted((c for c in range(nc) if c in feeds_input or c in of_matrix or
                        param_bytes[c] >= total / 200),
                       key=lambda c: (c == batch, -param_bytes[c])) + \
            sorted((nc + g for g in range(ng)),
                   key=lambda i: -group_bytes[i - nc])

        def options(shape, i):
            return _options(search, names, shape, sizes, i)

        def mean_evaluation():
            return (time.perf_counter() - t_search) / max(1, len(search.cache))

        def out_of_time():
            # Kept inside the limit: the evaluation about to start and two exact re-plans
            # (a build and two steps each, about 3.5 evaluations), at the mean cost so far.
            return time.perf_counter() + 8 * mean_evaluation() > deadline

        t_search = time.perf_counter()
        timed_out = False
        starts = []  # (layout, shape, choice)
        widest = max(range(nc), key=lambda c: param_bytes[c], default=-1)
        model_classes = [c for c in order if c < nc and c not in feeds_input and c != widest]
        for sweep in _seeds(shapes, names, nc, ng, batch, model_classes, options,
                            lambda choice: search.specs(choice) is not None):
            best_start = min((l for l, _, _ in starts), key=_rank, default=None)
            found, timed_out = _plan_sweep(search, names, sweep, out_of_time, best_start)
            starts += found
            if timed_out:
                break
        # The layout ILP on the mesh shapes of the best seeds, its solution planned for real
        # and descended from with the seeds.
        solved = []
        if ilp and not auto_shard_ilp.solver_available():
            solved.append(auto_shard_ilp.IlpResult((), None, 0, 0, 0, "skipped: no scipy >= 1.9", 0))
        elif ilp and mean_evaluation() * _ILP_MIN_EVALUATIONS > time_limit:
            # (the ILP costs a recorded step, its coefficients and a planned solution per
            # shape: about five evaluations; where the limit affords few, the descent from the
            # seeds spends them better: Llama 70B on 2048 chips, 2 s each, lost 1.5% with it)
            solved.append(auto_shard_ilp.IlpResult(
                (), None, 0, 0, 0, f"skipped: an evaluation takes {mean_evaluation():.1f} s, "
                f"the limit affords fewer than {_ILP_MIN_EVALUATIONS}", 0))
        elif ilp:
            by_seed = list(dict.fromkeys(s for _, s, _ in sorted(starts, key=lambda s: _rank(s[0]))))
            for shape in by_seed[:_ILP_SHAPES]:
                if timed_out or out_of_time():
                    break
                costs, num_options = _ilp_costs(search, names, shape, hw)
                solved.append(auto_shard_ilp.solve(
                    costs, num_options, budget, _ILP_SHARE * time_limit / _ILP_SHAPES, shape))
                if solved[-1].choice is None or out_of_time():
                    continue
                choice = [_options(search, names, shape, sizes, i)[o]
                          for i, o in enumerate(solved[-1].choice)]
                lay = search.evaluate(shape, names, choice)
                if lay is not None:
                    solved[-1].planned_step_seconds, solved[-1].planned_fits = \
                        lay.predicted_step_seconds, lay.fits
                    starts.append((lay, shape, choice))
        if not starts:
            raise RuntimeError("auto_shard: no layout of the step could be planned")
        starts.sort(key=lambda s: _rank(s[0]))
        for lay, shape, choice in starts:  # descend from every seed, the best first
            if timed_out:
                break
            # While nothing fits, the classes of the inputs' dims come first: sharding them
            # (the sequence, besides the batch) is what divides the activations, which make
            # most of a peak that storing the parameters sharded has not brought down.
            first = order if search.fitting_found else \
                [c for c in order if c in feeds_input] + [c for c in order if c not in feeds_input]
            timed_out = _descend(search, shape, names, lay, choice, first,
                                 lambda i: options(shape, i), out_of_time)
        best, runners, cut = _rerank(search, rerank, deadline)
        timed_out = timed_out or cut
    return AutoShardResult(best, runners, len(search.cache),
                           time.perf_counter() - t0, timed_out, search.classes, solved)


def plan_layouts(build: Callable, step: Callable, num_devices: int, layouts: Dict[str, tuple],
                 hardware="tpu-v4", memory_budget: Optional[float] = None) -> Dict[str, Optional[Layout]]:
    """Plans hand-written layouts of one step in one session (to compare them, or to compare
    ``auto_shard``'s choice with them). ``layouts`` maps a name to ``(mesh_shape, axis_names,
    param_spec, input_specs)``: ``param_spec(name, parameter)`` gives a parameter's partition
    spec, ``input_specs`` one spec per input. ``build`` and ``step`` are as for
    ``auto_shard``. A layout the step cannot be planned in maps to None."""
    from . import Plan
    hw, budget = _hardware_and_budget(hardware, memory_budget)
    out = {}
    with Plan(num_devices=num_devices, hardware=hw) as plan:
        search = _Search(build, step, plan, budget, tie_blocks=False)
        for name, (shape, names, param_spec, input_specs) in layouts.items():
            if math.prod(shape) != num_devices:
                raise ValueError(f"plan_layouts: layout {name!r} has mesh shape {tuple(shape)} "
                                 f"for {num_devices} devices")
            specs = [tuple(param_spec(n, p)) for n, p in search.params] + \
                [tuple(s) for s in input_specs]
            out[name] = search.evaluate_specs(tuple(shape), tuple(names), specs, exact=True)
    return out
