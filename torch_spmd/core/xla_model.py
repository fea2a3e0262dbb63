"""PyTorch/XLA's ``torch_xla.core.xla_model`` (``xm``) for the spmd device."""
import torch

from .. import _C
from .._device import device as _device

_step_closures = []


def xla_device(n=None, devkind=None) -> torch.device:
    """The spmd device (one logical device in SPMD mode)."""
    return _device(0 if n is None else n)


def mark_step(wait: bool = False, reset_scope: bool = True) -> None:
    """Executes all pending operations as one graph, then runs the step closures."""
    _C._mark_step()
    _run_step_closures()


def add_step_closure(closure, args=(), run_async=False):
    """Runs ``closure(*args)`` after the current step's graph has executed."""
    _step_closures.append((closure, args))


def _run_step_closures():
    global _step_closures
    closures, _step_closures = _step_closures, []
    for fn, args in closures:
        fn(*args)


def wait_device_ops(devices=()):
    """Execution is synchronous on the emulated devices: nothing to wait for."""


def get_memory_info(device=None) -> dict:
    """``{'bytes_used', 'bytes_limit', 'peak_bytes_used'}`` of one emulated device.

    ``device`` is an emulated device index (default 0); a torch.device selects device 0.
    """
    index = 0
    if isinstance(device, int):
        index = device
    elif isinstance(device, str) and device.rsplit(":", 1)[-1].isdigit():
        index = int(device.rsplit(":", 1)[-1])
    info = _C._memory_info(index)
    return {k: info[k] for k in ("bytes_used", "bytes_limit", "peak_bytes_used")}
