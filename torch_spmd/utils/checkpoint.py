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


def checkpoint_name(t: torch.Tensor, name: str) -> torch.Tensor:
    """``t`` under ``name`` (JAX's ``checkpoint_name``, as MaxText names ``query_proj``,
    ``decoder_layer_input``, ...): a checkpoint policy from
    ``save_and_offload_only_these_names`` saves it, or offloads it to host memory
    (``torch_spmd.memory``), by that name. Elsewhere an identity (a copy off the spmd device)."""
    from ..memory import _checkpoint_name_op
    if not isinstance(name, str):
        raise TypeError(f"checkpoint_name: name must be a str, got {type(name).__name__}")
    return _checkpoint_name_op(t, name)


def save_and_offload_only_these_names(names_which_can_be_saved=(), names_which_can_be_offloaded=()):
    """A ``context_fn`` for ``checkpoint(..., use_reentrant=False)`` (JAX's policy of that name,
    MaxText's offloaded remat policies): the values named by ``checkpoint_name`` in the first
    list are saved, those in the second saved in host memory (offloaded: read back by the
    backward, ``torch_spmd.memory``), everything else recomputed."""
    import contextlib

    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    from ..memory import _offloaded_names  # (registers torch.ops.spmd.checkpoint_name)
    saved, offloaded = frozenset(names_which_can_be_saved), frozenset(names_which_can_be_offloaded)
    both = saved & offloaded
    if both:
        raise ValueError(f"save_and_offload_only_these_names: {sorted(both)} are both saved and "
                         f"offloaded; name each in one list")
    named = torch.ops.spmd.checkpoint_name.default

    def policy(ctx, op, *args, **kwargs):
        if op == named and args[1] in saved | offloaded:
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    @contextlib.contextmanager
    def offloading(inner):
        previous = getattr(_offloaded_names, "names", frozenset())
        _offloaded_names.names = offloaded
        try:
            with inner:
                yield
        finally:
            _offloaded_names.names = previous

    def context_fn():
        forward, recompute = create_selective_checkpoint_contexts(policy)
        return offloading(forward), recompute

    return context_fn
