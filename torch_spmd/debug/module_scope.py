"""Module attribution: every op recorded on the spmd device carries the path of the module it ran
under (``blocks.3.attn.qkv``; ``blocks.3.attn.qkv (backward)`` for the ops autograd records for
it), kept through partitioning, so collectives, FLOPs and bytes can be attributed to modules
(``torch_spmd.debug.comm_report``).

The tracker uses torch's global module hooks: a forward pre-hook and hook keep the stack of
running modules (paths relative to the outermost module: the root itself is ``""``), and for
outputs that need gradients a multi-grad hook marks where the module's backward starts (its
outputs' gradients are ready) and one on its inputs where it ends. Optimizer steps are scoped
``optimizer``. It is on by default (``enable(False)`` turns it off); modules running on other
devices are not affected beyond the hook calls.
"""
import threading
import weakref
from typing import List, Optional, Tuple

import torch
from torch.utils.hooks import RemovableHandle

from .. import _C

_state = threading.local()
_names: "weakref.WeakKeyDictionary[torch.nn.Module, str]" = weakref.WeakKeyDictionary()
_descendants: "weakref.WeakKeyDictionary[torch.nn.Module, dict]" = weakref.WeakKeyDictionary()
_handles: List[RemovableHandle] = []
_end_of_backward_queued = [False]


def _stack() -> List[Tuple["weakref.ref", str]]:
    if not hasattr(_state, "stack"):
        _state.stack = []
    return _state.stack


def _path_of(module: torch.nn.Module, parent: Optional[Tuple["weakref.ref", str]]) -> str:
    """The module's path below the outermost running module (found among the parent's
    descendants: ModuleList/ModuleDict containers never run themselves)."""
    if parent is None:
        return ""
    parent_ref, parent_path = parent
    parent_module = parent_ref()
    if parent_module is None:
        return _names.get(module, type(module).__name__)
    rel = _relative_path(parent_module, module)
    if rel is None:
        return _names.get(module, type(module).__name__)
    return f"{parent_path}.{rel}" if parent_path else rel


def _relative_path(parent: torch.nn.Module, module: torch.nn.Module) -> Optional[str]:
    """`module`'s path among `parent`'s descendants, or None. Memoized per parent (a forward
    runs every module each step; walking the tree each time cost milliseconds per step), and
    walked again when the module is not found there (the tree changed)."""
    paths = _descendants.get(parent)
    entry = paths.get(id(module)) if paths is not None else None
    if entry is None or entry[0]() is not module:
        paths = {id(m): (weakref.ref(m), rel) for rel, m in parent.named_modules() if rel}
        _descendants[parent] = paths
        entry = paths.get(id(module))
        if entry is None:
            return None
    return entry[1]


def _is_spmd(t) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == "spmd"


def _grad_tensors(x) -> List[torch.Tensor]:
    if isinstance(x, torch.Tensor):  # the common case, without a pytree walk
        return [x] if x.requires_grad and _is_spmd(x) else []
    if isinstance(x, tuple) and len(x) == 1 and isinstance(x[0], torch.Tensor):
        return _grad_tensors(x[0])
    from torch.utils._pytree import tree_leaves
    return [t for t in tree_leaves(x) if isinstance(t, torch.Tensor) and t.requires_grad
            and _is_spmd(t)]


def _on_first_grad(tensors: List[torch.Tensor], hook) -> None:
    """Calls `hook` when the first of `tensors`' gradients is ready (a plain tensor hook for one
    tensor: what a multi-grad hook in "any" mode registers, without its bookkeeping)."""
    if len(tensors) == 1:
        tensors[0].register_hook(hook)  # returns None: the gradient is kept
    else:
        torch.autograd.graph.register_multi_grad_hook(tensors, hook, mode="any")


def _set(path: str) -> None:
    _C._set_scope(path)


def _reset_after_backward() -> None:
    _end_of_backward_queued[0] = False
    stack = _stack()
    _set(stack[-1][1] if stack else "")


_backward_hooks: dict = {}


def _backward_scope(path: str):
    """The hook that enters `path`'s backward scope (one per path: a forward registers it on
    many tensors every step)."""
    hook = _backward_hooks.get(path)
    if hook is None:
        scope = f"{path} (backward)"

        def hook(_grads):
            _set(scope)
            if not _end_of_backward_queued[0]:
                _end_of_backward_queued[0] = True
                torch.autograd.Variable._execution_engine.queue_callback(_reset_after_backward)
        _backward_hooks[path] = hook
    return hook


def _pre_forward(module, args):
    stack = _stack()
    path = _path_of(module, stack[-1] if stack else None)
    _names[module] = path
    stack.append((weakref.ref(module), path))  # weak: the stack never keeps a model alive
    _set(path)


def _post_forward(module, args, output):
    # Runs when the forward raised too (always_call): the stack never keeps a failed module.
    stack = _stack()
    while stack and stack[-1][0]() is not module and any(r() is module for r, _ in stack):
        stack.pop()
    if stack and stack[-1][0]() is module:
        stack.pop()
    parent = stack[-1][1] if stack else ""
    _set(parent)
    if not torch.is_grad_enabled():
        return
    path = _names.get(module, "")
    outs = _grad_tensors(output)
    if outs:  # the module's backward starts when its outputs' gradients are ready
        _on_first_grad(outs, _backward_scope(path))
    ins = _grad_tensors(args)
    if ins and stack:  # ... and ends when its inputs' are: back to the parent's backward
        _on_first_grad(ins, _backward_scope(parent))


def _pre_step(optimizer, args, kwargs):
    _set("optimizer")


def _post_step(optimizer, args, kwargs):
    stack = _stack()
    _set(stack[-1][1] if stack else "")


def enable(on: bool = True) -> None:
    """Turns module attribution on (the default) or off."""
    global _handles
    for h in _handles:
        h.remove()
    _handles = []
    _set("")
    if not on:
        return
    from torch.nn.modules import module as module_mod
    from torch.optim import optimizer as optimizer_mod
    _handles = [
        module_mod.register_module_forward_pre_hook(_pre_forward),
        module_mod.register_module_forward_hook(_post_forward, always_call=True),
        optimizer_mod.register_optimizer_step_pre_hook(_pre_step),
        optimizer_mod.register_optimizer_step_post_hook(_post_step),
    ]


def current() -> str:
    """The module path ops are being recorded under now."""
    return _C._scope()
