"""The explicit cross-replica collectives of ``xm`` (PyTorch/XLA's multi-process mode).

In multi-process mode (``xmp.spawn``: one process per replica) each call records an ``xm::``
node in the lazy graph; it runs at the next sync with everything else, over the gloo process
groups of the world (see torch_spmd/distributed/_process_world.py). With a single replica (SPMD
mode, or no spawn) every collective is over a group of one: the identity, times ``scale``.

``groups``: None (all replicas) or a list of replica lists, each replica in exactly one, all of
one size; members are ordered as listed (all_gather concatenates in that order).
``pin_layout`` is accepted for compatibility: host buffers have no layout to pin.

Autograd: in multi-process mode the tensor forms of ``all_reduce``, ``all_gather``,
``reduce_scatter`` and ``all_to_all`` are differentiable (their ``output=`` and in-place list
forms are not). Every replica's output feeds that replica's loss, and the gradient is the one
of the sum of all replicas' losses: the backward of an all-gather is a reduce-scatter (sum) of
the output gradients, of a reduce-scatter an all-gather, of an all-reduce (sum) an all-reduce
(sum), of an all-to-all the reverse all-to-all, each over the same groups and times ``scale``.
For MAX / MIN every replica holding the extreme value gets the gradient of the reduced
element. (PyTorch/XLA's ``xm`` collectives cut the graph; its ``torch_xla.core.functions``
variants pass only the local gradient: each replica's own output gradient, or its own slice
of it.) With a single replica the collectives are clones and scalings, differentiable as such.
"""
import torch

from .. import _C
from .._impl.device import is_spmd_tensor
from .._impl import process_world as _process_world

REDUCE_SUM = "sum"
REDUCE_MUL = "mul"
REDUCE_AND = "and"
REDUCE_OR = "or"
REDUCE_MIN = "min"
REDUCE_MAX = "max"

_REDUCE_OPS = {REDUCE_SUM: 0, REDUCE_MAX: 1, REDUCE_MIN: 2}


def _reduce_op(reduce_type):
    if reduce_type not in _REDUCE_OPS:
        raise ValueError(f"reduce_type {reduce_type!r} is not supported; use one of "
                         f"{sorted(_REDUCE_OPS)} (xm.REDUCE_SUM, xm.REDUCE_MAX, xm.REDUCE_MIN)")
    return _REDUCE_OPS[reduce_type]


def _check_tensor(t, api):
    if not is_spmd_tensor(t):
        raise TypeError(f"xm.{api} expects tensors on the spmd device, got "
                        f"{type(t).__name__ if not isinstance(t, torch.Tensor) else t.device}")


def _groups(groups, api, count=None, count_name=None):
    """The groups as lists, creating the communicators they need (multi-process mode)."""
    out = _process_world.groups_for(groups)
    size = len(out[0])
    if _process_world.current() is None and (len(out) != 1 or out[0] != [0]):
        raise ValueError(f"xm.{api}: groups {groups} name replicas that do not exist: there is "
                         "one replica (spawn processes with xmp.spawn for more)")
    if count is not None and count != size:
        raise ValueError(f"xm.{api}: {count_name}={count} must equal the group size {size}")
    return out


def _multiprocess():
    return _process_world.current() is not None


def _assign(dst, src):
    """dst takes src's value in place (seen by views and aliases of dst)."""
    _C._xm_assign(dst, src)


# ---------------------------------------------------------------------------------------------
# Autograd. The forward of each Function records the same xm:: node as the non-differentiable
# call; the backward records the collective that carries the output gradients back to the
# replicas whose inputs produced them (through .apply, so that it is differentiable too).
# ``groups`` here are already normalized lists (``_groups``).

def _differentiable(t, output=None):
    return output is None and _multiprocess() and torch.is_grad_enabled() and t.requires_grad


def _where_extreme(x, extreme, grad):
    """``grad`` where ``x`` holds the reduced extreme, 0 elsewhere."""
    return torch.where(x == extreme, grad, torch.zeros_like(grad))


class _AllReduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, op, scale, groups):
        ctx.op, ctx.scale, ctx.groups = op, scale, groups
        if op == _REDUCE_OPS[REDUCE_SUM]:
            return _C._xm_all_reduce([x], op, scale, groups)[0]
        # MAX / MIN: reduce unscaled, so that the backward finds which inputs won exactly.
        extreme = _C._xm_all_reduce([x], op, 1.0, groups)[0]
        ctx.save_for_backward(x, extreme)
        return extreme * scale if scale != 1.0 else extreme

    @staticmethod
    def backward(ctx, grad):
        total = _AllReduce.apply(grad, _REDUCE_OPS[REDUCE_SUM], ctx.scale, ctx.groups)
        if ctx.op != _REDUCE_OPS[REDUCE_SUM]:
            x, extreme = ctx.saved_tensors
            total = _where_extreme(x, extreme, total)
        return total, None, None, None


class _AllGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, groups):
        ctx.dim, ctx.groups = dim, groups
        return _C._xm_all_gather(x, dim, groups)

    @staticmethod
    def backward(ctx, grad):
        return (_ReduceScatter.apply(grad, _REDUCE_OPS[REDUCE_SUM], 1.0, ctx.dim, ctx.groups),
                None, None)


class _ReduceScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, op, scale, dim, groups):
        ctx.op, ctx.scale, ctx.dim, ctx.groups = op, scale, dim, groups
        if op == _REDUCE_OPS[REDUCE_SUM]:
            return _C._xm_reduce_scatter(x, op, scale, dim, groups)
        extreme = _C._xm_reduce_scatter(x, op, 1.0, dim, groups)
        ctx.save_for_backward(x, extreme)
        return extreme * scale if scale != 1.0 else extreme

    @staticmethod
    def backward(ctx, grad):
        if ctx.scale != 1.0:
            grad = grad * ctx.scale
        full = _AllGather.apply(grad, ctx.dim, ctx.groups)
        if ctx.op != _REDUCE_OPS[REDUCE_SUM]:
            x, extreme = ctx.saved_tensors
            full = _where_extreme(x, _C._xm_all_gather(extreme, ctx.dim, ctx.groups), full)
        return full, None, None, None, None


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, split_dim, concat_dim, groups):
        ctx.split_dim, ctx.concat_dim, ctx.groups = split_dim, concat_dim, groups
        return _C._xm_all_to_all(x, split_dim, concat_dim, groups)

    @staticmethod
    def backward(ctx, grad):
        # Chunk j of member i's input became chunk i (on concat_dim) of member j's output.
        return (_AllToAll.apply(grad, ctx.concat_dim, ctx.split_dim, ctx.groups),
                None, None, None)


def all_reduce(reduce_type, inputs, scale=1.0, groups=None, pin_layout=True):
    """Reduces ``inputs`` (a tensor, or a list of tensors) over the replicas of each group,
    then multiplies by ``scale``. A tensor gives a new tensor; a list is updated in place (one
    coalesced collective) and returned, as in PyTorch/XLA."""
    op = _reduce_op(reduce_type)
    single = isinstance(inputs, torch.Tensor)
    tensors = [inputs] if single else list(inputs)
    for t in tensors:
        _check_tensor(t, "all_reduce")
    groups = _groups(groups, "all_reduce")
    if single and _differentiable(inputs):
        return _AllReduce.apply(inputs, op, float(scale), groups)
    if _multiprocess():
        results = _C._xm_all_reduce(tensors, op, float(scale), groups)
    else:
        results = [t * scale if scale != 1.0 else t.clone() for t in tensors]
    if single:
        return results[0]
    for t, r in zip(tensors, results):
        _assign(t, r)
    return inputs


def _with_output(result, output):
    if output is None:
        return result
    _assign(output, result)
    return output


def all_gather(value, dim=0, groups=None, output=None, pin_layout=True):
    """Concatenates the group members' ``value`` on ``dim`` (in group order). A list of
    tensors gathers each; ``output`` (a tensor, or a list for a list) receives the result."""
    if not isinstance(value, torch.Tensor):
        outputs = output if output is not None else [None] * len(value)
        return [all_gather(v, dim, groups, o, pin_layout) for v, o in zip(value, outputs)]
    _check_tensor(value, "all_gather")
    groups = _groups(groups, "all_gather")
    if dim < 0:
        dim += value.dim()
    if _differentiable(value, output):
        return _AllGather.apply(value, dim, groups)
    result = _C._xm_all_gather(value, dim, groups) if _multiprocess() else value.clone()
    return _with_output(result, output)


def reduce_scatter(reduce_type, input, scale, scatter_dim, shard_count, groups=None,
                   output=None, pin_layout=True):
    """Reduces ``input`` over each group, multiplies by ``scale`` and keeps this member's
    chunk (of ``shard_count`` = the group size) of ``scatter_dim``. A list of tensors
    reduce-scatters each; ``output`` receives the result."""
    if not isinstance(input, torch.Tensor):
        outputs = output if output is not None else [None] * len(input)
        return [reduce_scatter(reduce_type, x, scale, scatter_dim, shard_count, groups, o,
                               pin_layout) for x, o in zip(input, outputs)]
    op = _reduce_op(reduce_type)
    _check_tensor(input, "reduce_scatter")
    groups = _groups(groups, "reduce_scatter", shard_count, "shard_count")
    if _differentiable(input, output):
        return _ReduceScatter.apply(input, op, float(scale), scatter_dim % input.dim(), groups)
    if _multiprocess():
        result = _C._xm_reduce_scatter(input, op, float(scale), scatter_dim, groups)
    else:
        result = input * scale if scale != 1.0 else input.clone()
    return _with_output(result, output)


def all_to_all(value, split_dimension, concat_dimension, split_count, groups=None,
               pin_layout=True):
    """Splits ``value`` into ``split_count`` (= the group size) chunks on ``split_dimension``,
    sends chunk j to group member j, and concatenates what arrives on ``concat_dimension`` in
    group order."""
    _check_tensor(value, "all_to_all")
    groups = _groups(groups, "all_to_all", split_count, "split_count")
    if not _multiprocess():
        return value.clone()
    if _differentiable(value):
        return _AllToAll.apply(value, split_dimension % value.dim(), concat_dimension % value.dim(),
                               groups)
    return _C._xm_all_to_all(value, split_dimension, concat_dimension, groups)


def rendezvous(tag, payload=b"", replicas=[]):
    """Waits for every replica in ``replicas`` (all when empty) to reach ``tag``; returns their
    payloads (bytes) in replica order. Host-side only: pending device work is not synced."""
    if not _multiprocess():
        return [payload]
    return _process_world.rendezvous(tag, payload, replicas)
