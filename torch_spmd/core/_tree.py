"""Rewriting the tensors inside nested Python data (PyTorch/XLA's ``ToXlaTensorArena``)."""
import copy
from typing import Any, Callable, List


def map_tensors(data: Any, select: Callable[[Any], bool],
                convert: Callable[[List[Any]], List[Any]]) -> Any:
    """A copy of ``data`` (dicts, lists, tuples, namedtuples, nested) in which every leaf that
    ``select`` accepts is replaced. ``convert`` receives all selected leaves at once (so a
    device sync can cover them together) and returns their replacements in the same order.
    Other leaves are kept as they are; a leaf seen twice is converted once.
    """
    leaves, index = [], {}

    def collect(x):
        if select(x):
            if id(x) not in index:
                index[id(x)] = len(leaves)
                leaves.append(x)
        elif isinstance(x, dict):
            for v in x.values():
                collect(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                collect(v)

    collect(data)
    if not leaves:
        return data
    converted = convert(leaves)

    def rebuild(x):
        if select(x):
            return converted[index[id(x)]]
        if isinstance(x, dict):
            out = copy.copy(x)  # keeps the dict type (OrderedDict, defaultdict's factory)
            for k, v in x.items():
                out[k] = rebuild(v)
            return out
        if isinstance(x, tuple) and hasattr(x, "_fields"):  # namedtuple
            return type(x)(*[rebuild(v) for v in x])
        if isinstance(x, (list, tuple)):
            return type(x)(rebuild(v) for v in x)
        return x

    return rebuild(data)
