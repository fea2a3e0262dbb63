"""Materializing modules built on the meta device before FSDP shards them (``param_init_fn``)."""
import warnings
from typing import Callable, Optional

import torch
import torch.nn as nn


def _materialize_module(module: nn.Module, param_init_fn: Optional[Callable[[nn.Module], None]],
                        ignored_params, deferred_init_check_fn: Callable = None) -> bool:
    """Initializes ``module`` in place if any of its parameters is on the meta device: with
    ``param_init_fn(module)`` when given, else ``to_empty(device='cpu')`` +
    ``reset_parameters()``. Returns whether anything was materialized.

    (torchdistX deferred init, which PyTorch/XLA also accepts, is not supported.)
    """
    params = [p for p in module.parameters() if p not in ignored_params]
    if not any(p.is_meta for p in params):
        return False
    if param_init_fn is not None:
        if not callable(param_init_fn):
            raise ValueError(
                f"Expected {param_init_fn} to be callable but got {type(param_init_fn)}")
        param_init_fn(module)
        return True
    module.to_empty(device="cpu")
    try:
        with torch.no_grad():
            module.reset_parameters()
    except BaseException as e:
        warnings.warn("Unable to call `reset_parameters()` for module on meta "
                      f"device with error {str(e)}. Please ensure your "
                      "module implements a `reset_parameters()` method.")
        raise e
    return True
