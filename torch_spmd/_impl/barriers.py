"""``xm.optimization_barrier_``, in a module of its own: the FSDPv2 hook in
``distributed.spmd._barriers`` calls it, and importing ``core.xla_model`` from there would close
an import cycle through the ``distributed.spmd`` package."""
import torch


def optimization_barrier_(tensors) -> None:
    """PyTorch/XLA's barrier against compiler rewrites across it; a no-op here, by design.

    XLA needs it because its compiler may merge a repeated computation with an earlier one
    (CSE: FSDP's backward all-gather with the forward one, a checkpointed layer's recomputation
    with its first forward) and keep the first result alive instead. Our lazy graph records
    every op call as a new node and never merges equal subexpressions, so a re-gather or a
    recomputation always runs again and the first result is freed after its last use. Accepts
    a list of spmd tensors (as XLA does) and leaves them untouched.
    """
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"optimization_barrier_ expects tensors, got {type(t).__name__}")
