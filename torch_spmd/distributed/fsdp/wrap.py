"""Auto-wrap policies for nested FSDP (PyTorch/XLA's ``torch_xla.distributed.fsdp.wrap``).

A policy is called as ``policy(module=m, recurse=bool, unwrapped_params=int)``: with
``recurse=True`` it says whether to look into ``m``'s children, with ``recurse=False`` whether to
wrap ``m`` itself (``unwrapped_params`` then counts the parameters its children did not take).
``recursive_wrap`` walks the module tree bottom-up with a policy; ``XlaFullyShardedDataParallel``
calls it with ``only_wrap_children=True`` when given ``auto_wrap_policy``.
"""
from typing import Any, Callable, Optional, Set, Tuple, Type

import torch.nn as nn


def always_wrap_policy(*args, **kwargs) -> bool:
    """Wraps every submodule as its own FSDP instance."""
    return True


def lambda_auto_wrap_policy(module: nn.Module, recurse: bool, unwrapped_params: int,
                            lambda_fn: Callable) -> bool:
    """Wraps the submodules for which ``lambda_fn(module)`` is true (always recurses)."""
    if recurse:
        return True
    return lambda_fn(module)


def transformer_auto_wrap_policy(module: nn.Module, recurse: bool, unwrapped_params: int,
                                 transformer_layer_cls: Set[Type[nn.Module]]) -> bool:
    """Wraps every instance of one of ``transformer_layer_cls`` (e.g. the transformer blocks);
    everything else stays with the outer FSDP instance."""
    if recurse:
        return True
    return isinstance(module, tuple(transformer_layer_cls))


def size_based_auto_wrap_policy(module: nn.Module, recurse: bool, unwrapped_params: int,
                                min_num_params: int = int(1e8),
                                force_leaf_modules: Optional[Set[Type[nn.Module]]] = None,
                                exclude_wrap_modules: Optional[Set[Type[nn.Module]]] = None
                                ) -> bool:
    """Wraps a module once at least ``min_num_params`` parameters are left unwrapped in it.

    Recurses only into modules that are large enough and not ``force_leaf_modules`` (default
    ``{nn.MultiheadAttention}``); never wraps ``exclude_wrap_modules`` (default
    ``{nn.ModuleList, nn.ModuleDict}``: they have no ``forward`` of their own).
    """
    force_leaf_modules = (size_based_auto_wrap_policy.FORCE_LEAF_MODULES
                          if force_leaf_modules is None else force_leaf_modules)
    exclude_wrap_modules = (size_based_auto_wrap_policy.EXCLUDE_WRAP_MODULES
                            if exclude_wrap_modules is None else exclude_wrap_modules)
    is_large = unwrapped_params >= min_num_params
    if recurse:
        return is_large and not isinstance(module, tuple(force_leaf_modules))
    return is_large and not isinstance(module, tuple(exclude_wrap_modules))


# The defaults, importable as attributes of the policy (as in PyTorch).
size_based_auto_wrap_policy.EXCLUDE_WRAP_MODULES = {nn.ModuleList, nn.ModuleDict}
size_based_auto_wrap_policy.FORCE_LEAF_MODULES = {nn.MultiheadAttention}


def _wrap(module: nn.Module, wrapper_cls: Callable, **kwargs) -> nn.Module:
    # A module's `_wrap_overrides` dict overrides the wrapper kwargs for that module only.
    overrides = getattr(module, "_wrap_overrides", None)
    if overrides is not None:
        return wrapper_cls(module, **{**kwargs, **overrides})
    return wrapper_cls(module, **kwargs)


def recursive_wrap(module: nn.Module, auto_wrap_policy: Callable, wrapper_cls: Callable,
                   ignored_modules: Set[nn.Module], ignored_params: Set[nn.Parameter],
                   only_wrap_children: bool = False, **kwargs: Any) -> Tuple[nn.Module, int]:
    """Wraps ``module``'s descendants (and ``module`` itself unless ``only_wrap_children``)
    that ``auto_wrap_policy`` selects with ``wrapper_cls(child, **kwargs)``, deepest first.

    Returns the (possibly wrapped) module and the number of parameters wrapped under it.
    """
    assert auto_wrap_policy is not None, "Must specify auto_wrap_policy."
    assert wrapper_cls is not None, "Must specify wrapper_cls"
    for _, child in module.named_modules():
        if child in ignored_modules:
            continue
        try:
            assert not isinstance(child, wrapper_cls)
        except TypeError:
            pass  # wrapper_cls is a function, not a class: nothing to check
    num_params = sum(p.numel() for p in module.parameters() if p not in ignored_params)
    if not auto_wrap_policy(module=module, recurse=True, unwrapped_params=num_params):
        return module, 0
    total_wrapped = 0
    for name, child in module.named_children():
        if child in ignored_modules:
            continue
        wrapped_child, num_wrapped = recursive_wrap(
            module=child, auto_wrap_policy=auto_wrap_policy, wrapper_cls=wrapper_cls,
            ignored_modules=ignored_modules, ignored_params=ignored_params, **kwargs)
        setattr(module, name, wrapped_child)
        total_wrapped += num_wrapped
    remainder = num_params - total_wrapped
    if not only_wrap_children and auto_wrap_policy(module=module, recurse=False,
                                                   unwrapped_params=remainder):
        return _wrap(module, wrapper_cls, **kwargs), num_params
    return module, total_wrapped
