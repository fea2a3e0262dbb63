"""``prime_optimizer``: give a fresh optimizer state tensors to load into."""
import torch

from ... import _C
from ...core import xla_model as xm
from ..._impl.device import is_spmd_tensor


def prime_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """Creates the optimizer's state by running one step with zero gradients.

    Optimizers create their state (Adam's ``exp_avg``...) lazily in their first ``step``, and
    ``load_sharded`` loads in place, so a fresh optimizer must be primed before a restore. The
    zero gradients are laid out like their parameters, so the state comes out sharded like them.

    **Destructive**: the step may change parameters (weight decay) and the state; call it only
    right before loading a checkpoint that overwrites both.

    Parameters that do not require grad get no state (as torch.distributed.checkpoint's own
    initialisation), so a checkpoint's state for a parameter frozen after it was trained is not
    loaded into it: set ``requires_grad_(True)`` on such parameters while priming, and back.
    """
    xm.mark_step()  # parameters backed by device data, their shardings known
    for group in optimizer.param_groups:
        for p in group["params"]:
            if not p.requires_grad:
                continue
            p.grad = torch.zeros_like(p, requires_grad=False)
            if is_spmd_tensor(p):
                axes = _C._get_sharding_axes(p)
                if axes is not None:  # match the gradient's sharding to the parameter's
                    _C._mark_sharding(p.grad, axes["device_ids"], axes["mesh_shape"],
                                      axes["axis_names"], axes["dim_axes"])
    optimizer.step()
    xm.mark_step()
    optimizer.zero_grad(set_to_none=True)
    return optimizer
