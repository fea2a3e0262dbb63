"""PyTorch/XLA's ``torch_xla.experimental.stablehlo_custom_call`` host-offloading pair:
``place_to_host`` and ``place_to_device``, as its users call them in saved-tensor hooks
(torch_spmd.memory). Other StableHLO custom calls have no torch_spmd counterpart."""
from ..memory import place_to_device, place_to_host

__all__ = ["place_to_host", "place_to_device"]
