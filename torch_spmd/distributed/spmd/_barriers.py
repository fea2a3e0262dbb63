"""``apply_backward_optimization_barrier`` (PyTorch/XLA's ``xs`` API, used by FSDPv2)."""
import torch

from ..._impl.barriers import optimization_barrier_


def apply_backward_optimization_barrier(m: torch.nn.Module) -> None:
    """Registers a full backward hook on ``m`` that passes its parameters' gradients and its
    input gradients through ``xm.optimization_barrier_``.

    In XLA this keeps the compiler from fusing ``m``'s backward with the rest; our graph does
    not merge or reorder across modules in that way, so the barrier is a no-op and the hook
    leaves the gradients unchanged.
    """

    def _barrier(module, grad_input, grad_output):
        tensors = [p.grad for p in module.parameters() if p.grad is not None]
        tensors += [g for g in grad_input if isinstance(g, torch.Tensor)]
        optimization_barrier_(tensors)

    m.register_full_backward_hook(_barrier)
