"""Activation checkpointing for spmd tensors (PyTorch/XLA's ``torch_xla.utils.checkpoint``).

``checkpoint(fn, *args)`` runs ``fn`` without keeping its intermediate activations and runs it
again in the backward pass, as ``torch.utils.checkpoint.checkpoint`` (reentrant variant) does.
On the lazy spmd device the recomputation is recorded as new IR nodes in the backward part of
the step's graph: the graph never merges them with the forward ones (no CSE), so the forward
activations die after their forward use and the recomputed ones are born right before their
backward use. That is why XLA's version needs an optimization barrier and this one does not
(``xm.optimization_barrier_`` is kept in the same place, as a no-op, for parity).

``chkpt_status.in_chkpt_bwd`` is true while a checkpointed function is recomputed and
back-propagated; FSDP reads it to keep a module's full parameters gathered between the
recomputation and its backward instead of freeing and re-gathering them.

Random ops on the spmd device draw their seeds from the host's default generator when they are
recorded (``torch.spmd``'s RNG state is that generator's), so with ``preserve_rng_state=True``
(the default) a recomputed dropout mask equals the forward one, as on CPU and CUDA.
"""
import inspect

import torch
from torch.utils.checkpoint import check_backward_validity, detach_variable

from ..core import xla_model as xm


class CheckpointStatus:
    """Whether a checkpointed function is being recomputed for its backward pass."""

    def __init__(self):
        self.in_chkpt_bwd = False


chkpt_status = CheckpointStatus()


def _tensors(values):
    return [v for v in values if isinstance(v, torch.Tensor)]


class CheckpointFunction(torch.autograd.Function):
    """Forward without saving activations; backward = recompute with grad, then backprop."""

    @staticmethod
    def forward(ctx, run_function, preserve_rng_state, *args):
        check_backward_validity(args)
        ctx.run_function = run_function
        ctx.preserve_rng_state = preserve_rng_state
        if preserve_rng_state:
            ctx.fwd_cpu_state = torch.get_rng_state()
        # Tensors go through save_for_backward (version checks); the rest is kept as is.
        ctx.inputs = [None if isinstance(a, torch.Tensor) else a for a in args]
        ctx.tensor_indices = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        ctx.save_for_backward(*_tensors(args))
        with torch.no_grad():
            return run_function(*args)

    @staticmethod
    def backward(ctx, *grads):
        if not torch.autograd._is_checkpoint_valid():
            raise RuntimeError(
                "Checkpointing is not compatible with .grad() or when an `inputs` parameter"
                " is passed to .backward(). Please use .backward() and do not pass its `inputs`"
                " argument.")
        chkpt_status.in_chkpt_bwd = True
        try:
            inputs = list(ctx.inputs)
            for i, t in zip(ctx.tensor_indices, ctx.saved_tensors):
                inputs[i] = t
            params = []
            fn = ctx.run_function
            if inspect.ismethod(fn) and isinstance(fn.__self__, torch.nn.Module):
                params = list(fn.__self__.parameters()) + list(fn.__self__.buffers())
            xm.optimization_barrier_(_tensors(inputs) + _tensors(grads) + params)
            with torch.random.fork_rng(devices=[], enabled=ctx.preserve_rng_state):
                if ctx.preserve_rng_state:
                    torch.set_rng_state(ctx.fwd_cpu_state)
                detached = detach_variable(tuple(inputs))
                with torch.enable_grad():
                    outputs = ctx.run_function(*detached)
            if isinstance(outputs, torch.Tensor):
                outputs = (outputs,)
            pairs = [(o, g) for o, g in zip(outputs, grads)
                     if isinstance(o, torch.Tensor) and o.requires_grad]
            if not pairs:
                raise RuntimeError("none of output has requires_grad=True,"
                                   " this checkpoint() is not necessary")
            torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
            return (None, None) + tuple(
                t.grad if isinstance(t, torch.Tensor) else None for t in detached)
        finally:
            chkpt_status.in_chkpt_bwd = False


# What torch.utils.checkpoint.checkpoint takes besides the function, its arguments and
# use_reentrant (the non-reentrant variant's selective checkpointing and checks).
_NON_REENTRANT_KWARGS = ("preserve_rng_state", "context_fn", "determinism_check", "debug")


def checkpoint(function, *args, use_reentrant: bool = True, **kwargs):
    """Checkpoints ``function(*args)``: activations inside it are recomputed in backward.

    Same contract as ``torch.utils.checkpoint.checkpoint``. ``use_reentrant=True`` (the default,
    the only variant PyTorch/XLA implements) takes ``preserve_rng_state`` and needs an input
    that requires grad. ``use_reentrant=False`` is torch's own, with its keyword arguments:
    ``context_fn`` (selective checkpointing, ``create_selective_checkpoint_contexts``: the
    policy's saved ops stay, the rest is recomputed), ``determinism_check``, ``debug``. Other
    keyword arguments are rejected, as torch rejects them.
    """
    unknown = [k for k in kwargs if k not in _NON_REENTRANT_KWARGS]
    if unknown:
        raise ValueError("Unexpected keyword arguments: " + ",".join(unknown))
    if not use_reentrant:
        return torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=False, **kwargs)
    only_non_reentrant = [k for k in kwargs if k != "preserve_rng_state"]
    if only_non_reentrant:
        raise ValueError(f"Passing {', '.join(only_non_reentrant)} is only supported when "
                         f"use_reentrant=False (torch.utils.checkpoint's rule)")
    return CheckpointFunction.apply(function, kwargs.get("preserve_rng_state", True), *args)
