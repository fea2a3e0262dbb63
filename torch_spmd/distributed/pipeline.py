"""Pipeline parallelism, GSPMD style (GSPMD paper §3.3; MaxText's pipeline): no separate
runtime, only sharding annotations on an ordinary PyTorch loop.

``Pipeline(blocks, mesh, "stage", num_microbatches=M)`` runs N identical blocks as S stages
over the mesh axis ``"stage"`` (S = its size):

- the blocks' parameters are stacked into tensors of shape [S, L, *shape], one per repeat of a
  circular pipeline (R repeats, L blocks per stage and repeat, N = R x S x L), whose stage dim
  is sharded over the axis: each device holds its stage's blocks only;
- the batch is cut into M micro-batches (rows m, m + M, m + 2M, ...: a batch dim sharded over
  the other mesh axes stays sharded within each micro-batch);
- a buffer of shape [S, micro-batch, ...] holds every stage's current activation, its stage dim
  sharded over the axis. Each of the R x M + S - 1 iterations runs every stage's blocks on its
  slot at once (``torch.vmap`` over the stacked weights: one program, each device its stage),
  then shifts the buffer one stage on with ``torch.roll``, which the compiler lowers to one
  collective-permute of a slot (rules/shift.cc); stage 0 then takes the next micro-batch. The
  last stage's output lands in slot 0: after the last repeat it is an output, before it the
  micro-batch's input to the next repeat (a circular pipeline, layer r x S x L + s x L + l on
  stage s);
- autograd gives the backward pipeline (the roll's adjoint shifts the other way).

Every stage computes in every iteration, on zeros while it waits for its first micro-batch
and after its last: the bubble, (S - 1) / (R M + S - 1) of the loop, is in the executed and
planned programs like any other work, and plan mode's report shows it
(``PlanReport.pipeline``).
"""
import copy
import functools
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn
from torch.func import functional_call

from .. import _C
from ..debug import module_scope
from ..plan.pipeline_schedule import Schedule, last_schedules, record_schedule  # noqa: F401
from .spmd import Mesh, mark_sharding_with_gradients

Spec = Tuple[Optional[object], ...]


def _on_spmd(t: torch.Tensor) -> bool:
    return t.device.type == "spmd"


class Pipeline(nn.Module):
    """N identical blocks (same structure, parameter shapes and dtypes; each maps a tensor to
    one of the same shape) run as a pipeline over ``stage_axis`` of ``mesh``. See the module
    docstring for how.

    Args:
      blocks: the N blocks in execution order; their parameters are copied into stacked ones
        (the blocks themselves are not kept). N must be a multiple of S x ``repeats``.
      mesh, stage_axis: the mesh and the name of its stage axis.
      num_microbatches: M; the batch (dim 0 of the input) must be a multiple of it.
      repeats: R, the circular pipeline's passes over the stages (1: each stage holds N / S
        consecutive blocks).
      activation_spec: partition spec of one micro-batch's activation (its dims, e.g.
        ``("data", None, None)`` for data parallelism on the other axes); replicated if None.
      param_spec: ``fn(name, shape) -> spec`` for one block's parameter (tensor or FSDP
        sharding on the other axes); replicated over them if None.
      checkpoint: recompute each iteration's blocks in the backward (activation
        checkpointing) instead of keeping their activations.
    """

    def __init__(self, blocks: Sequence[nn.Module], mesh: Mesh, stage_axis: str = "stage",
                 num_microbatches: int = 1, repeats: int = 1,
                 activation_spec: Optional[Spec] = None,
                 param_spec: Optional[Callable[[str, torch.Size], Spec]] = None,
                 checkpoint: bool = False):
        super().__init__()
        blocks = list(blocks)
        names = mesh.axis_names or ()
        if stage_axis not in names:
            raise ValueError(f"stage_axis {stage_axis!r} is not an axis of the mesh {names}")
        stages = mesh.shape()[stage_axis]
        if num_microbatches < 1 or repeats < 1:
            raise ValueError(f"num_microbatches ({num_microbatches}) and repeats ({repeats}) "
                             "must be at least 1")
        if repeats > 1 and num_microbatches < stages:
            raise ValueError(f"a circular pipeline (repeats={repeats}) needs at least as many "
                             f"micro-batches as stages: num_microbatches={num_microbatches} < "
                             f"{stages} stages")
        if not blocks or len(blocks) % (stages * repeats):
            raise ValueError(f"{len(blocks)} blocks cannot be split into {stages} stages x "
                             f"{repeats} repeats: need a positive multiple of {stages * repeats}")
        first = dict(blocks[0].named_parameters())
        buffers = dict(blocks[0].named_buffers())
        for i, b in enumerate(blocks[1:], 1):
            p = dict(b.named_parameters())
            if {k: (v.shape, v.dtype) for k, v in p.items()} != \
                    {k: (v.shape, v.dtype) for k, v in first.items()}:
                raise ValueError(f"block {i} is not identical to block 0: parameters "
                                 f"{sorted(p)} vs {sorted(first)} (or their shapes/dtypes)")
        self.mesh, self.stage_axis = mesh, stage_axis
        self.stages, self.repeats = stages, repeats
        self.layers_per_stage = len(blocks) // (stages * repeats)
        self.num_microbatches = num_microbatches
        self.activation_spec = activation_spec
        self.checkpoint = checkpoint
        # The blocks' structure, without data: functional_call runs it on the stacked weights.
        # Held outside the module tree (its meta parameters are not the model's); the holder
        # names it "block" in module attribution.
        template = copy.deepcopy(blocks[0]).to("meta")
        holder = nn.Module()
        holder.block = template
        self._template = (template, holder)
        self._param_names = list(first)
        self._buffer_names = list(buffers)
        self._specs = {n: tuple(param_spec(n, p.shape)) if param_spec else (None,) * p.dim()
                       for n, p in first.items()}
        # One tensor [S, L, *shape] per parameter and repeat: a repeat's weights are a whole
        # parameter, so an iteration's weight gradient is as large as the parameter it adds
        # into and its pending sum over the data axes is reduced once per step, not once per
        # iteration (a slice of one [R, ...] tensor would make each gradient R times larger).
        self.stacked = nn.ParameterDict()
        blocks_of = lambda name, getter: torch.stack([getter(b)[name] for b in blocks]).reshape(
            (repeats, stages, self.layers_per_stage) + getter(blocks[0])[name].shape)
        for name in self._param_names:
            t = blocks_of(name, lambda b: {k: v.detach() for k, v in b.named_parameters()})
            for r in range(repeats):
                p = nn.Parameter(t[r].clone(), requires_grad=first[name].requires_grad)
                self.stacked[self._stacked_key(name, r)] = p
                self._shard(p, self._specs[name])
        for name in self._buffer_names:
            t = blocks_of(name, lambda b: dict(b.named_buffers()))
            for r in range(repeats):
                self.register_buffer("stacked_buffer_" + self._stacked_key(name, r), t[r].clone())

    def _stacked_key(self, name: str, repeat: int) -> str:
        key = name.replace(".", "__")
        return key if self.repeats == 1 else f"{key}__repeat{repeat}"

    def _stacked(self, name: str, repeat: int) -> torch.Tensor:
        if name in self._specs:
            return self.stacked[self._stacked_key(name, repeat)]
        return getattr(self, "stacked_buffer_" + self._stacked_key(name, repeat))

    def _shard(self, t: torch.Tensor, spec: Spec) -> None:
        if _on_spmd(t):
            from .spmd import mark_sharding
            mark_sharding(t, self.mesh, (self.stage_axis, None) + tuple(spec))

    def _apply(self, fn, recurse=True):
        # Moving to the device (model.to("spmd")) lays the stacked weights out over the stages.
        out = super()._apply(fn, recurse)
        for name in self._param_names:
            for r in range(self.repeats):
                p = self._stacked(name, r)
                if _on_spmd(p) and not _C._get_sharding_spec(p):
                    self._shard(p, self._specs[name])
        return out

    @property
    def bubble_fraction(self) -> float:
        """(S - 1) / (R M + S - 1): the share of the loop's stage-iterations with no work."""
        s = self.stages
        return (s - 1) / (self.repeats * self.num_microbatches + s - 1)

    def unstacked_state_dict(self) -> Dict[str, torch.Tensor]:
        """The parameters as the N blocks had them: ``"<block index>.<name>"`` (to compare with,
        or load into, the unpipelined model's block list); block r S L + s L + l is layer l of
        stage s in repeat r."""
        out = {}
        per_repeat = self.stages * self.layers_per_stage
        for name in self._param_names:
            for r in range(self.repeats):
                w = self._stacked(name, r)
                flat = w.reshape((per_repeat,) + w.shape[2:])
                for i in range(per_repeat):
                    out[f"{r * per_repeat + i}.{name}"] = flat[i]
        return out

    # The forward.

    def _constrain(self, state: torch.Tensor) -> torch.Tensor:
        if not _on_spmd(state):
            return state
        spec = self.activation_spec or (None,) * (state.dim() - 1)
        return mark_sharding_with_gradients(state, self.mesh, (self.stage_axis,) + tuple(spec))

    def _weights(self, t: int) -> Dict[str, torch.Tensor]:
        """Every stage's blocks for iteration t, as tensors [S, L, *shape]: stage s runs repeat
        clamp((t - s) // M, 0, R - 1). Where the stages are at different repeats, each
        repeat's weights are masked to its stages and summed: each device reads only its own
        stage's weights, with no communication."""
        names = self._param_names + self._buffer_names
        m, r_max = self.num_microbatches, self.repeats - 1
        repeat = [min(max((t - s) // m, 0), r_max) for s in range(self.stages)]
        if len(set(repeat)) == 1:
            # A view per iteration: autograd sums the iteration's per-layer gradients there
            # first (into one stack, partition/simplify.cc), then across iterations, so their
            # pending sums over the data axes stay pending to the end of the step.
            return {n: self._stacked(n, repeat[0]).view(self._stacked(n, repeat[0]).shape)
                    for n in names}
        device = self._stacked(names[0], 0).device
        masks = {r: torch.tensor([float(x == r) for x in repeat]).to(device)  # stages of repeat r
                 for r in sorted(set(repeat))}
        out = {}
        for n in names:
            parts = []
            for r, mask in masks.items():
                w = self._stacked(n, r)
                parts.append(w * mask.to(w.dtype).reshape((self.stages,) + (1,) * (w.dim() - 1)))
            out[n] = functools.reduce(torch.add, parts)  # (adds: a pending sum passes them)
        return out

    def _run_stages(self, weights: Dict[str, torch.Tensor], state: torch.Tensor,
                    extra: tuple) -> torch.Tensor:
        template = self._template[0]
        params = set(self._param_names)

        def stage(w: Dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
            for layer in range(self.layers_per_stage):
                p = {n: v[layer] for n, v in w.items() if n in params}
                b = {n: v[layer] for n, v in w.items() if n not in params}
                x = functional_call(template, (p, b), (x,) + extra)
            return x

        run = torch.vmap(stage, randomness="different")
        if self.checkpoint and torch.is_grad_enabled():
            from torch.utils.checkpoint import checkpoint
            return checkpoint(run, weights, state, use_reentrant=False)
        return run(weights, state)

    def forward(self, x: torch.Tensor, *extra) -> torch.Tensor:
        """x: [batch, ...]; ``extra`` args go unchanged to every block. Returns the blocks'
        output for every row of x, in x's order."""
        S, M, R = self.stages, self.num_microbatches, self.repeats
        if x.dim() == 0 or x.shape[0] % M:
            raise ValueError(f"the batch (dim 0 of an input of shape {tuple(x.shape)}) must be a "
                             f"multiple of num_microbatches={M}")
        micro = x.reshape((x.shape[0] // M, M) + x.shape[1:])  # micro-batch m: rows m::M
        stage = torch.arange(S, device=x.device)
        first = (stage == 0).reshape((S,) + (1,) * (x.dim()))
        state = self._constrain(x.new_zeros((S, x.shape[0] // M) + x.shape[1:]))
        held: Dict[int, torch.Tensor] = {}  # micro-batch -> buffer with its next input in slot 0
        done: List[Optional[torch.Tensor]] = [None] * M
        busy = []
        holder = self._template[1]
        path = module_scope.current()
        for t in range(R * M + S - 1):
            with module_scope.scope(f"iteration{t}", holder):
                if t < R * M:
                    m = t % M
                    inp = held.pop(m) if t >= M else micro[:, m].unsqueeze(0)
                    state = self._constrain(torch.where(first, inp, state))
                out = self._run_stages(self._weights(t), state, extra)
                state = self._constrain(torch.roll(out, 1, 0))
            busy.append(sum(1 for s in range(S) if 0 <= t - s < R * M))
            item = t - (S - 1)  # the micro-batch pass that left the last stage now
            if 0 <= item < R * M:
                if item // M == R - 1:
                    done[item % M] = state
                else:
                    held[item % M] = state
        record_schedule(Schedule(path, S, M, R, busy))
        # Slot 0 of each finished buffer: a masked sum over the stages (one all-reduce).
        slot0 = first.reshape((S,) + (1,) * (x.dim() + 1))
        return (torch.stack(done, 2) * slot0).sum(0).reshape(x.shape)  # [x.shape[0] // M, M, ...]
