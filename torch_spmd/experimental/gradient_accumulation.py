"""PyTorch/XLA's ``torch_xla.experimental.gradient_accumulation``: ``gradient_accumulation``
runs a training step over each slice of the leading dim of its inputs and accumulates the
gradients of the mean loss into the model's parameters.

PyTorch/XLA builds one XLA ``While`` loop, so the step is traced once. torch_spmd records
ops lazily and partitions whole graphs, so the loop is a Python loop recorded into the same
step: the same values and gradients (the slices are taken on the device, the step boundary
stays the caller's), one graph that grows with the number of accumulation steps.
"""
from typing import Any, Callable, Optional, Sequence, Tuple, Union

import torch


def gradient_accumulation(
        train_step: Callable[..., Any], iterable_tensors: Sequence[torch.Tensor],
        model: torch.nn.Module, carried_tensors: Optional[Tuple[torch.Tensor, ...]] = None
) -> Union[torch.Tensor, Tuple[torch.Tensor, ...]]:
    """Calls ``train_step(*slices, *carried)`` for each index of the inputs' leading dim
    (``train_step`` returns the loss, or ``(loss, *carried)``), backpropagates
    ``loss / steps`` into ``model``'s parameters' ``.grad`` each time, and returns the summed
    ``loss / steps`` (detached), followed by the last carried tensors when ``carried_tensors``
    is given."""
    if isinstance(iterable_tensors, torch.Tensor):
        iterable_tensors = (iterable_tensors,)
    iterable_tensors = tuple(iterable_tensors)
    if not iterable_tensors:
        raise ValueError("gradient_accumulation: iterable_tensors is empty")
    steps = iterable_tensors[0].shape[0] if iterable_tensors[0].dim() > 0 else 0
    for i, t in enumerate(iterable_tensors):
        if t.dim() == 0 or t.shape[0] != steps:
            raise ValueError(
                f"gradient_accumulation: iterable tensor {i} has shape {tuple(t.shape)}; every "
                f"one must have the same leading dim (the accumulation steps, {steps} for "
                "tensor 0)")
    if steps == 0:
        raise ValueError("gradient_accumulation: the leading dim (accumulation steps) is 0")
    carried = tuple(carried_tensors) if carried_tensors is not None else ()
    total = None
    for step in range(steps):
        out = train_step(*(t[step] for t in iterable_tensors), *carried)
        if isinstance(out, (tuple, list)):
            loss, carried = out[0], tuple(out[1:])
        else:
            loss = out
        loss = loss / steps
        loss.backward()
        total = loss.detach() if total is None else total + loss.detach()
    if carried_tensors is None:
        return total
    return (total,) + tuple(carried)
