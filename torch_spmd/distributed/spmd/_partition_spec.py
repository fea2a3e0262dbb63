"""Partition specs: validation (PyTorch/XLA's checks, wording and exception types) and their
conversion to the C++ named-axis form (per tensor dim, the mesh axes that tile it).

A spec has one entry per tensor dim: a mesh axis index, an axis name, None (replicated), or a
tuple of indices/names (the dim is tiled over all of them, first one most major). Unlike
PyTorch/XLA, lists are accepted wherever tuples are (its lru_cache rejects list specs).
"""
import numbers
from typing import List, Tuple, Union

from ._sharding_type import ShardingType

PartitionSpec = Tuple[Union[Tuple[Union[int, str], ...], int, str, None], ...]


def normalize(partition_spec) -> tuple:
    """The spec as a tuple, with list entries turned into tuples (at any depth, so that nested
    groups are still caught by the nested-tuple check)."""
    if not isinstance(partition_spec, (tuple, list)):
        raise TypeError("partition_spec must be a tuple (or list) with one entry per tensor dim, "
                        f"got {type(partition_spec).__name__}: {partition_spec!r}")

    def norm(p):
        return tuple(norm(x) for x in p) if isinstance(p, (tuple, list)) else p

    return norm(partition_spec)


def _is_index(p) -> bool:
    # bool is an int subclass, but True/False as mesh axes is a bug, as in PyTorch/XLA.
    return isinstance(p, numbers.Integral) and not isinstance(p, bool)


def translate(mesh, partition_spec: tuple) -> tuple:
    """Replaces axis names by indices (PyTorch/XLA's ``_translate_named_partition_spec``).

    Raises AssertionError for nested tuples, ValueError for an unknown axis name or an
    unsupported entry type.
    """
    out = []
    for p in partition_spec:
        if isinstance(p, tuple):
            assert not any(isinstance(x, tuple) for x in p), \
                'Partition spec cannot contain nested tuples'
            out.append(translate(mesh, p))
        elif p is None:
            out.append(None)
        elif _is_index(p):
            out.append(int(p))
        elif isinstance(p, str):
            idx = mesh.get_axis_name_idx(p)
            if idx is None:
                raise ValueError(f"Axis name {p} is not defined in the given mesh")
            out.append(idx)
        else:
            raise ValueError(f"Spec type {type(p)} is not supported in partition spec")
    return tuple(out)


def _axes_of(entry) -> List[int]:
    if entry is None:
        return []
    if isinstance(entry, tuple):
        return [a for a in entry if a is not None]
    return [entry]


def to_dim_axes(mesh, partition_spec) -> List[List[int]]:
    """Validates a spec against ``mesh`` and returns, per tensor dim, the mesh axes tiling it.

    Raises (in PyTorch/XLA's order): the errors of ``translate``, then AssertionError for an
    out-of-bound axis index and for an axis used more than once.
    """
    spec = translate(mesh, normalize(partition_spec))
    dim_axes = [_axes_of(p) for p in spec]
    flat = [a for axes in dim_axes for a in axes]
    rank = len(mesh.mesh_shape)
    assert all(0 <= a < rank for a in flat), \
        f"partition_spec ({spec}) contains out of bound index into mesh_shape."
    assert len(flat) == len(set(flat)), \
        f"Each device mesh dimension should appear at most once in partition_spec {spec}."
    return dim_axes


def _get_sharding_type(partition_spec: tuple, num_devices: int) -> ShardingType:
    """PyTorch/XLA's type rule for a translated spec: MAXIMAL on one device, REPLICATED if all
    entries are None, PARTIAL if some are, TILED otherwise."""
    if num_devices == 1:
        return ShardingType.MAXIMAL
    if all(d is None for d in partition_spec):
        return ShardingType.REPLICATED
    if any(d is None for d in partition_spec):
        return ShardingType.PARTIAL
    return ShardingType.TILED


def sharding_type_for(mesh, partition_spec) -> ShardingType:
    """The Python-side type PyTorch/XLA derives for a spec on ``mesh`` (before the C++ layer
    canonicalizes, e.g. a PARTIAL spec whose replication covers every device prints
    ``{replicated}``)."""
    spec = translate(mesh, normalize(partition_spec))
    if len(spec) == 0:
        return ShardingType.REPLICATED
    # Rank of the tile assignment: the transposed mesh with each tuple's axes merged into one.
    merged = sum(len(p) - 1 for p in spec if isinstance(p, tuple) and p)
    if len(mesh.mesh_shape) - merged > len(spec):
        return ShardingType.PARTIAL
    return _get_sharding_type(spec, int(mesh.size()))
