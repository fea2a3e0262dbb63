"""Nested state dicts as flat ``fqn -> leaf`` maps, and writing leaves back by path.

A state dict is nested dicts (any keys) and lists/tuples. Dicts are always descended into;
lists and tuples only when they hold a tensor somewhere (so ``param_groups[i]['params'] =
[0, 1, 2]`` stays one leaf, as in torch.distributed.checkpoint). A leaf's path is the tuple of
keys leading to it; its fully qualified name (fqn) joins them with dots, e.g.
``optim.state.0.exp_avg``.
"""
from typing import Any, Dict, List, Tuple

import torch

Path = Tuple[Any, ...]


def _holds_tensor(x: Any) -> bool:
    if isinstance(x, torch.Tensor):
        return True
    if isinstance(x, dict):
        return any(_holds_tensor(v) for v in x.values())
    if isinstance(x, (list, tuple)):
        return any(_holds_tensor(v) for v in x)
    return False


def fqn_of(path: Path) -> str:
    """``('optim', 'state', 0, 'exp_avg')`` -> ``'optim.state.0.exp_avg'``."""
    return ".".join(str(k) for k in path)


def flatten(state_dict: Any) -> Dict[str, Tuple[Path, Any]]:
    """``fqn -> (path, leaf)`` for every leaf, in traversal order. Raises ValueError when two
    paths print to the same fqn (e.g. keys ``0`` and ``'0'`` side by side)."""
    out: Dict[str, Tuple[Path, Any]] = {}

    def visit(path: Path, x: Any) -> None:
        if isinstance(x, dict):  # an empty dict contributes nothing (nothing to load into)
            for k, v in x.items():
                visit(path + (k,), v)
            return
        if isinstance(x, (list, tuple)) and _holds_tensor(x):
            for i, v in enumerate(x):
                visit(path + (i,), v)
            return
        fqn = fqn_of(path)
        if fqn in out:
            raise ValueError(f"state_dict keys {out[fqn][0]} and {path} have the same name "
                             f"{fqn!r}; checkpoints identify entries by name")
        out[fqn] = (path, x)

    visit((), state_dict)
    return out


def set_leaf(root: Any, path: Path, value: Any) -> Any:
    """Replaces the leaf at ``path`` with ``value``; returns ``root`` (a new object only if
    ``root`` itself is a tuple, which cannot change in place; tuples inside are rebuilt and
    stored back into their parents)."""
    if not path:
        return value
    key, rest = path[0], path[1:]
    child = set_leaf(root[key], rest, value)
    if isinstance(root, tuple):
        items: List[Any] = list(root)
        items[key] = child
        return type(root)(*items) if hasattr(root, "_fields") else type(root)(items)
    if child is not root[key]:
        root[key] = child
    return root
