"""Host memory for activations: values kept in the host's memory between the forward pass and
the backward pass instead of the device's (XLA's host memory space; PyTorch's
``torch.autograd.graph.save_on_cpu``; MaxText's offloaded remat policies).

``offload(t)`` marks a value: its readers in the backward read it from host memory, its
forward readers from device memory as usual. When the step runs, the compiler copies it to the
host where it was marked and back right before its first backward reader
(``csrc/partition/offload.h``); in between it takes no device memory, and its host's memory
holds it (``SPMD_HOST_MEMORY`` per host, ``SPMD_DEVICES_PER_HOST`` devices each; in a plan, the
hardware's ``host_memory_bytes`` and ``host_devices``). The copies cross each device's host
link (the hardware's ``host_bandwidth``) on streams of their own, overlapping the compute.
Values are unchanged: the result equals CPU eager's.

Three ways to use it:

- ``torch.autograd.graph.save_on_cpu()``: every tensor autograd saves inside the block is
  offloaded (torch_spmd makes it do so for spmd tensors; other devices are untouched), e.g.
  around a model whose blocks are checkpointed keeps each block's input on the host;
- ``offload(t)`` in the model, with a selective checkpoint policy that saves the marks
  (``torch_spmd.utils.checkpoint.save_and_offload_only_these_names`` with
  ``checkpoint_name``, as MaxText names its tensors);
- PyTorch/XLA's ``place_to_host``/``place_to_device`` pair in saved-tensor hooks.
"""
import threading

import torch

from . import _C
from ._impl.device import is_spmd_tensor

__all__ = ["offload", "place_to_host", "place_to_device"]


# The mark is an operator (torch.ops.spmd.offload), so that selective checkpointing's policies
# see it and can save it (torch_spmd.utils.checkpoint.save_and_offload_only_these_names).
@torch.library.custom_op("spmd::offload", mutates_args=())
def _offload_op(t: torch.Tensor, to_host: bool) -> torch.Tensor:
    """Other devices: the value (on CPU, host memory is the device's)."""
    return t.clone()


@_offload_op.register_kernel("spmd")
def _(t: torch.Tensor, to_host: bool) -> torch.Tensor:
    return _C._offload(t, to_host)


@_offload_op.register_fake
def _(t: torch.Tensor, to_host: bool) -> torch.Tensor:
    return torch.empty_like(t)


_offload_op.register_autograd(lambda ctx, grad: (grad, None))


# Names of values to offload while a checkpointed forward runs (save_and_offload_only_these_names
# in torch_spmd.utils.checkpoint sets them).
_offloaded_names = threading.local()


@torch.library.custom_op("spmd::checkpoint_name", mutates_args=())
def _checkpoint_name_op(t: torch.Tensor, name: str) -> torch.Tensor:
    """Other devices: the value."""
    return t.clone()


@_checkpoint_name_op.register_kernel("spmd")
def _(t: torch.Tensor, name: str) -> torch.Tensor:
    return _C._offload(t, name in getattr(_offloaded_names, "names", ()))


@_checkpoint_name_op.register_fake
def _(t: torch.Tensor, name: str) -> torch.Tensor:
    return torch.empty_like(t)


_checkpoint_name_op.register_autograd(lambda ctx, grad: (grad, None))


def offload(t: torch.Tensor) -> torch.Tensor:
    """``t``, marked to be read from host memory by the backward (module docstring). On other
    devices, a copy of ``t`` (on CPU, host memory is the device's)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"offload expects a tensor, got {type(t).__name__}")
    return _offload_op(t, True)


def place_to_host(t: torch.Tensor) -> torch.Tensor:
    """PyTorch/XLA's ``place_to_host`` (``torch_xla.experimental.stablehlo_custom_call``), as
    its users call it: in a saved-tensor pack hook, with ``place_to_device`` unpacking. The
    value is offloaded for the backward (``offload``)."""
    return offload(t)


def place_to_device(t: torch.Tensor) -> torch.Tensor:
    """PyTorch/XLA's ``place_to_device``: the inverse of ``place_to_host``. The compiler copies
    an offloaded value back before the first backward op reading it, so this returns ``t``."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"place_to_device expects a tensor, got {type(t).__name__}")
    return t


def _pack_for_host(t: torch.Tensor) -> torch.Tensor:
    """A saved-tensor pack hook's offload: the mark without autograd history (a pack hook runs
    inside the op saving ``t``)."""
    return _C._offload(t, True)
