"""PyTorch/XLA's ``torch_xla.amp``: ``autocast(device, ...)``, which is ``torch.autocast`` on
the spmd device (CUDA's op lists; bfloat16 by default, as PyTorch/XLA uses on TPUs). bfloat16
has float32's exponent range, so it needs no loss scaling (``GradScaler`` is not provided)."""
from typing import Optional

import torch


class autocast(torch.autocast):
    """``torch_xla.amp.autocast(device, enabled=True, dtype=None, cache_enabled=True)``:
    ``torch.autocast("spmd", ...)``; ``device`` is the spmd (or ``xla``) device."""

    def __init__(self, device=None, enabled: bool = True, dtype: Optional[torch.dtype] = None,
                 cache_enabled: bool = True):
        if device is not None and torch.device(device).type not in ("spmd", "xla"):
            raise ValueError(f"torch_xla.amp.autocast: device {device!r} is not the spmd "
                             "device; use torch.autocast for other devices")
        super().__init__("spmd", dtype=dtype or torch.get_autocast_dtype("spmd"),
                         enabled=enabled, cache_enabled=cache_enabled)
