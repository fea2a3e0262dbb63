"""Module attribution: every op recorded on the spmd device carries the path of the module it ran
under (``blocks.3.attn.qkv``; ``blocks.3.attn.qkv (backward)`` for the ops autograd records for
it), kept through partitioning, so collectives, FLOPs and bytes can be attributed to modules
(``torch_spmd.debug.comm_report``).

The tracker uses torch's global module hooks: a forward pre-hook and hook keep the stack of
running modules (paths relative to the outermost module: the root itself is ``""``) and set the
scope forward ops are recorded under. The backward needs no hooks: the C++ side notes which
autograd nodes each scope created (aten/backward_scope.h), and an op recorded while autograd runs
a node takes that node's forward scope with `` (backward)`` appended (`` (backward)`` alone for
the outermost module and for ops outside any module, such as the loss). Optimizer steps are
scoped ``optimizer``. It is on by default (``enable(False)`` turns it off); modules running on
other devices are not affected beyond the hook calls.
"""
import contextlib
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


def _set(path: str) -> None:
    _C._set_scope(path)


# The hooks are global, so dynamo traces them into every torch.compile'd module (any device),
# and tracing the stack of weak references to running modules fails there ("... is already
# tracked for mutation"). Under compilation they do nothing: dynamo reads
# torch.compiler.is_compiling() as True and drops the hook's body from the graph, and what runs
# compiled records no ops on the spmd device to attribute.
_compiling = torch.compiler.is_compiling


def _pre_forward(module, args):
    if _compiling():
        return
    stack = _stack()
    path = _path_of(module, stack[-1] if stack else None)
    _names[module] = path
    stack.append((weakref.ref(module), path))  # weak: the stack never keeps a model alive
    _set(path)


def _post_forward(module, args, output):
    # Runs when the forward raised too (always_call): the stack never keeps a failed module.
    if _compiling():
        return
    stack = _stack()
    while stack and stack[-1][0]() is not module and any(r() is module for r, _ in stack):
        stack.pop()
    if stack and stack[-1][0]() is module:
        stack.pop()
    _set(stack[-1][1] if stack else "")


def _pre_step(optimizer, args, kwargs):
    if not _compiling():
        _set("optimizer")


def _post_step(optimizer, args, kwargs):
    if _compiling():
        return
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
        _C._clear_forward_scopes()  # the backward of what ran so far is not attributed either
        return
    from torch.nn.modules import module as module_mod
    from torch.optim import optimizer as optimizer_mod
    _handles = [
        module_mod.register_module_forward_pre_hook(_pre_forward),
        module_mod.register_module_forward_hook(_post_forward, always_call=True),
        optimizer_mod.register_optimizer_step_pre_hook(_pre_step),
        optimizer_mod.register_optimizer_step_post_hook(_post_step),
    ]


@contextlib.contextmanager
def scope(name: str, holder: torch.nn.Module):
    """Records what runs inside under ``<current path>.<name>`` (a part of a module's forward,
    e.g. one iteration of a pipeline); a module run inside is named by its path in ``holder``
    below that (``pipe.iteration3.block``), and its backward ops ``... (backward)`` as usual."""
    if _compiling() or not _handles:
        yield
        return
    stack = _stack()
    top = stack[-1][1] if stack else ""
    path = f"{top}.{name}" if top else name
    entry = (weakref.ref(holder), path)
    stack.append(entry)
    _set(path)
    try:
        yield
    finally:
        if entry in stack:
            del stack[len(stack) - 1 - stack[::-1].index(entry)]
        _set(stack[-1][1] if stack else "")


def current() -> str:
    """The module path ops are being recorded under now."""
    return _C._scope()
