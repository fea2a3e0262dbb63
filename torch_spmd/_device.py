"""The spmd device object and the step boundary."""
import torch

from . import _C

_BACKEND_NAME = "privateuseone"
if hasattr(torch.utils, "rename_privateuse1_backend"):  # torch >= 2.1
    try:
        torch.utils.rename_privateuse1_backend("spmd")
    except RuntimeError:  # already renamed by an earlier import
        pass
    _BACKEND_NAME = "spmd"


def device(index: int = 0) -> torch.device:
    """The spmd device: ``privateuseone:0`` on torch 1.13, ``spmd:0`` on torch >= 2.1.

    In SPMD mode there is one logical device; the emulated devices of the mesh are behind it.
    """
    if index != 0:
        raise ValueError(f"the spmd device has a single logical index 0, got {index}")
    return torch.device(_BACKEND_NAME, 0)


def is_spmd_tensor(t) -> bool:
    """Whether ``t`` is a tensor on the spmd device."""
    return isinstance(t, torch.Tensor) and t.device.type == _BACKEND_NAME


def sync() -> None:
    """Executes everything recorded so far as one graph (``xm.mark_step()``)."""
    from .core import xla_model
    xla_model.mark_step()
