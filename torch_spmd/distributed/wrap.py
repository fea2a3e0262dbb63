"""Auto-wrap policies and ``recursive_wrap``, shared by FSDP (v1) and FSDPv2.

Same functions, signatures, defaults and semantics as PyTorch/XLA's
``torch_xla.distributed.fsdp.wrap`` (itself adapted from ``torch.distributed.fsdp.wrap`` of
PyTorch 1.13). A policy is called as ``policy(module=m, recurse=..., unwrapped_params=n)``:
with ``recurse=True`` it says whether to descend into ``m``'s children, with ``recurse=False``
whether to wrap ``m`` itself (its not-yet-wrapped parameters number ``n``).

This module is neutral ground: FSDPv2 (``torch_spmd.experimental``) and FSDP v1
(``torch_spmd.distributed.fsdp``) both use it, so the two wrappers accept the same policies.
"""
from typing import Any, Callable, Optional, Set, Tuple, Type, cast

import torch.nn as nn

__all__ = [
    "check_wrappable",
    "always_wrap_policy",
    "lambda_auto_wrap_policy",
    "transformer_auto_wrap_policy",
    "size_based_auto_wrap_policy",
    "recursive_wrap",
]


def always_wrap_policy(*args, **kwargs) -> bool:
    """Wraps every submodule (each becomes its own wrapper instance)."""
    return True


def lambda_auto_wrap_policy(module: nn.Module, recurse: bool, unwrapped_params: int,
                            lambda_fn: Callable) -> bool:
    """Always recurses; wraps a module iff ``lambda_fn(module)`` is true.

    Bind ``lambda_fn`` with ``functools.partial`` before passing the policy.
    """
    if recurse:
        return True
    return lambda_fn(module)


def transformer_auto_wrap_policy(module: nn.Module, recurse: bool, unwrapped_params: int,
                                 transformer_layer_cls: Set[Type[nn.Module]]) -> bool:
    """Always recurses; wraps the instances of ``transformer_layer_cls`` (a set of classes).
    Everything else is left to the outermost wrapper.
    """
    if recurse:
        return True
    return isinstance(module, tuple(transformer_layer_cls))


def size_based_auto_wrap_policy(
    module: nn.Module,
    recurse: bool,
    unwrapped_params: int,
    min_num_params: int = int(1e8),
    force_leaf_modules: Optional[Set[Type[nn.Module]]] = None,
    exclude_wrap_modules: Optional[Set[Type[nn.Module]]] = None,
) -> bool:
    """Recurses into / wraps modules with at least ``min_num_params`` unwrapped parameters.

    Never recurses into ``force_leaf_modules`` (default ``{nn.MultiheadAttention}``) and never
    wraps ``exclude_wrap_modules`` (default ``{nn.ModuleList, nn.ModuleDict}``, which have no
    forward of their own). The defaults live on the function as ``FORCE_LEAF_MODULES`` and
    ``EXCLUDE_WRAP_MODULES`` so that callers can extend them.
    """
    force_leaf_modules = (size_based_auto_wrap_policy.FORCE_LEAF_MODULES
                          if force_leaf_modules is None else force_leaf_modules)
    exclude_wrap_modules = (size_based_auto_wrap_policy.EXCLUDE_WRAP_MODULES
                            if exclude_wrap_modules is None else exclude_wrap_modules)
    is_large = unwrapped_params >= min_num_params
    if recurse:
        return is_large and not isinstance(module, tuple(force_leaf_modules))
    return is_large and not isinstance(module, tuple(exclude_wrap_modules))


size_based_auto_wrap_policy.EXCLUDE_WRAP_MODULES = {nn.ModuleList, nn.ModuleDict}
size_based_auto_wrap_policy.FORCE_LEAF_MODULES = {nn.MultiheadAttention}


def _wrap(module: nn.Module, wrapper_cls: Callable, **kwargs) -> nn.Module:
    assert wrapper_cls is not None
    # A module may force its own wrapper arguments (PyTorch uses this to keep BatchNorm out of
    # mixed precision).
    if hasattr(module, "_wrap_overrides"):
        return wrapper_cls(module, **{**kwargs, **module._wrap_overrides})
    return wrapper_cls(module, **kwargs)


def recursive_wrap(module: nn.Module,
                   auto_wrap_policy: Callable,
                   wrapper_cls: Callable,
                   ignored_modules: Set[nn.Module],
                   ignored_params: Set[nn.Parameter],
                   only_wrap_children: bool = False,
                   **kwargs: Any) -> Tuple[nn.Module, int]:
    """Wraps the submodules of ``module`` that ``auto_wrap_policy`` selects, bottom-up.

    Children are wrapped first (and replaced on their parent with ``setattr``); then ``module``
    itself is wrapped if the policy accepts the parameters its children left unwrapped, unless
    ``only_wrap_children`` (the root wrapper passes True to avoid wrapping itself twice).
    ``kwargs`` go to ``wrapper_cls`` (overridden by a module's ``_wrap_overrides``).

    Returns ``(module or its wrapper, number of parameters wrapped)``.
    """
    assert auto_wrap_policy is not None, "Must specify auto_wrap_policy."
    assert wrapper_cls is not None, "Must specify wrapper_cls"
    # Make sure no child is already wrapped.
    for _, child in module.named_modules():
        if child in ignored_modules:
            continue
        try:
            assert not isinstance(child, cast(type, wrapper_cls))
        except TypeError:
            # wrapper_cls is a function rather than a class: nothing to check.
            pass

    # All parameters count, assuming none of them is wrapped yet.
    num_params = sum(p.numel() for p in module.parameters() if p not in ignored_params)

    if auto_wrap_policy(module=module, recurse=True, unwrapped_params=num_params):
        total_wrapped_params = 0
        for name, child in module.named_children():
            if child in ignored_modules:
                continue
            wrapped_child, num_wrapped_params = recursive_wrap(
                module=child,
                auto_wrap_policy=auto_wrap_policy,
                wrapper_cls=wrapper_cls,
                ignored_modules=ignored_modules,
                ignored_params=ignored_params,
                **kwargs,
            )
            setattr(module, name, wrapped_child)
            total_wrapped_params += num_wrapped_params
        # Wrap this module too if what its children left over is worth a wrapper.
        remainder = num_params - total_wrapped_params
        if not only_wrap_children and auto_wrap_policy(
                module=module, recurse=False, unwrapped_params=remainder):
            return _wrap(module, wrapper_cls, **kwargs), num_params
        return module, total_wrapped_params
    return module, 0


def check_wrappable(module: nn.Module, wrapper_cls: type) -> None:
    """PyTorch/XLA's checks before wrapping ``module`` in FSDP (v1 or v2): not already wrapped,
    and a ``forward`` of its own (``nn.ModuleList`` and ``nn.ModuleDict`` have none)."""
    if isinstance(module, wrapper_cls):
        raise RuntimeError(
            "Cannot wrap a module that is already wrapped with FSDP. For nested FSDP, "
            "first wrap the inner child modules before wrapping the outer parent module.")
    is_forward_defined = (hasattr(module, "forward") and hasattr(module.forward, "__func__")
                          and module.forward.__func__ != nn.Module.forward)
    if not is_forward_defined:
        raise RuntimeError(
            "The module wrapped by FSDP *must define a `forward` method and call it "
            "during the module's forward pass for FSDP to work correctly.* "
            "Hence, do not wrap `nn.ModuleList` or `nn.ModuleDict` with FSDP "
            "(since they don't have `forward` defined), "
            "and do not perform the forward pass in other ways apart from the `forward` "
            "method. (i.e. you should directly call the FSDP-wrapped module itself in your "
            "code, instead of using any of its submodules or its weights).")
