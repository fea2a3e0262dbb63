"""The spmd device object, the emulated device set behind it, and the step boundary."""
import os
from typing import Union

import torch

from .. import _C
from . import step as _step

from .. import device_module

_BACKEND_NAME = "spmd"


def _register_backend() -> None:
    """PrivateUse1 becomes ``torch.device("spmd")``, with ``torch.spmd`` as its device module and
    the generated ``Tensor.spmd()``, ``Tensor.is_spmd``, ``Module.spmd()``; autocast on it
    defaults to bfloat16."""
    if torch._C._get_privateuse1_backend_name() != _BACKEND_NAME:
        torch.utils.rename_privateuse1_backend(_BACKEND_NAME)
    if getattr(torch, _BACKEND_NAME, None) is not device_module:
        torch._register_device_module(_BACKEND_NAME, device_module)
    if not hasattr(torch.Tensor, "is_" + _BACKEND_NAME):
        torch.utils.generate_methods_for_privateuse1_backend(
            for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=False)
    # torch.autocast("spmd") without a dtype takes torch.get_autocast_dtype("spmd"), which torch
    # initialises to float16 for every PrivateUse1 backend. The device stands for a TPU pod, and
    # PyTorch/XLA autocasts to bfloat16 there (same exponent range as float32: no loss scaling).
    # torch keeps this setting per thread, like all autocast state: it holds for the importing
    # thread; another thread sets it the same way or passes dtype=.
    torch.set_autocast_dtype(_BACKEND_NAME, torch.bfloat16)


_register_backend()


def device(index: int = 0) -> torch.device:
    """The spmd device, ``torch.device("spmd", 0)``.

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
    _step.mark_step()


def configure_devices(num_devices: int, memory: Union[int, str, None] = None) -> None:
    """Replaces the emulated device set: ``num_devices`` devices of ``memory`` bytes each.

    ``memory`` is a byte count or text such as ``'16GiB'`` / ``'512MB'``; ``None`` uses
    ``SPMD_DEVICE_MEMORY`` (default ``16GiB``). Fails (RuntimeError) while any device buffer is
    live, because existing shards could not be mapped onto the new devices. Meshes built for the
    old device count become unusable. Clears the compile cache.
    """
    if memory is None:
        memory = os.environ.get("SPMD_DEVICE_MEMORY", "16GiB")
    if isinstance(memory, str):
        memory = _C._parse_bytes(memory)
    if isinstance(memory, bool) or not isinstance(memory, int):
        raise TypeError(f"memory must be an int (bytes) or a string like '16GiB', got {memory!r}")
    # Compiled programs were partitioned for the old devices, and cached graphs can still hold
    # device buffers of their first inputs, which would block the reconfiguration.
    _C._clear_compile_cache()
    _C._configure_devices(int(num_devices), memory)
