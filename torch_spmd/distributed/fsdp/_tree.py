"""Visiting the tensors inside (nested) module inputs and outputs.

Written without recursive closures on purpose: a nested function that calls itself is a
reference cycle, and the tensors it captured would outlive the call until the garbage collector
runs. On the lazy device a tensor alive at ``mark_step`` becomes a graph output and keeps its
buffer, so such cycles showed up as device memory growing step after step.
"""
from collections import OrderedDict
from typing import Any, Callable, List

import torch
from torch.nn.utils.rnn import PackedSequence


def _apply(fn: Callable, x: Any) -> Any:
    if torch.is_tensor(x):
        return fn(x)
    if isinstance(x, OrderedDict):
        od = x.__class__()
        for key, value in x.items():
            od[key] = _apply(fn, value)
        return od
    if isinstance(x, PackedSequence):
        _apply(fn, x.data)
        return x
    if isinstance(x, dict):
        return {key: _apply(fn, value) for key, value in x.items()}
    if isinstance(x, list):
        return [_apply(fn, v) for v in x]
    if isinstance(x, tuple):
        return tuple(_apply(fn, v) for v in x)
    if isinstance(x, set):
        return {_apply(fn, v) for v in x}
    return x


def apply_to_tensors(fn: Callable, container: Any) -> Any:
    """``container`` with ``fn(t)`` in place of every tensor (dicts, lists, tuples, sets)."""
    return _apply(fn, container)


def _collect(x: Any, out: List[torch.Tensor], seen: set) -> None:
    if torch.is_tensor(x):
        if id(x) not in seen:
            seen.add(id(x))
            out.append(x)
    elif isinstance(x, PackedSequence):
        _collect(x.data, out, seen)
    elif isinstance(x, dict):
        for value in x.values():
            _collect(value, out, seen)
    elif isinstance(x, (list, tuple, set)):
        for value in x:
            _collect(value, out, seen)


def collect_tensors(container: Any) -> List[torch.Tensor]:
    """Every distinct tensor in ``container``, in visiting order."""
    out: List[torch.Tensor] = []
    _collect(container, out, set())
    return out


def _cast_if_floating(dtype: torch.dtype, t: torch.Tensor) -> torch.Tensor:
    if t.dtype != dtype and torch.is_floating_point(t):
        return t.to(dtype)
    return t


def cast_floating_tensors(dtype: torch.dtype, *args: Any, **kwargs: Any):
    """``(args, kwargs)`` with every floating-point tensor cast to ``dtype``."""
    fn = lambda t: _cast_if_floating(dtype, t)  # noqa: E731
    return apply_to_tensors(fn, args), apply_to_tensors(fn, kwargs)
