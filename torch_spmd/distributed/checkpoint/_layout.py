"""Shard geometry and assembling a region of a tensor from saved pieces.

A *box* is ``(offsets, lengths)``: per dim, where a piece starts in the global tensor and how
many elements it covers. Saved pieces are disjoint boxes that together cover the tensor; any
target box (one device's shard under any mesh and spec) is assembled by copying in the
intersection with every piece.
"""
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from ... import _C
from ..._impl import process_span as _process_span
# Every device's shard of a sharding (shared with the minibatch upload, which is below this).
from ..._impl.tiles import Box, DeviceShard, device_shards  # noqa: F401


def is_tiled(sharding: str) -> bool:
    """Whether a sharding (XLA text; ``""`` for none) splits some dim over several devices."""
    if sharding == "":
        return False
    ta = _C._parse_sharding_spec(sharding)
    if ta["replicated"] or ta["manual"]:
        return False
    tensor_dims = ta["dims"][:-1] if ta["last_tile_dim_replicate"] else ta["dims"]
    return any(t > 1 for t in tensor_dims)


def _intersect(a: Box, b: Box) -> Optional[Tuple[List[slice], List[slice]]]:
    """Slices of ``a``'s and ``b``'s local coordinates covering their overlap, or None."""
    in_a, in_b = [], []
    for ao, al, bo, bl in zip(a[0], a[1], b[0], b[1]):
        lo, hi = max(ao, bo), min(ao + al, bo + bl)
        if hi <= lo:
            return None
        in_a.append(slice(lo - ao, hi - ao))
        in_b.append(slice(lo - bo, hi - bo))
    return in_a, in_b


def assemble(fqn: str, target: Box, padded_shape: Sequence[int],
             pieces: Sequence[Tuple[Box, torch.Tensor]], dtype: torch.dtype) -> torch.Tensor:
    """A ``padded_shape`` host tensor holding the ``target`` box of the global tensor (zeros
    in the padding), copied from the saved ``pieces`` (``(box, data)`` each).

    Raises RuntimeError when the pieces do not cover the box exactly once (a damaged
    checkpoint): every element must come from exactly one piece.
    """
    out = torch.zeros(tuple(padded_shape), dtype=dtype)
    needed = int(np.prod(target[1])) if len(target[1]) else 1
    covered = 0
    for box, data in pieces:
        if len(box[1]) == 0:  # a scalar: one piece is the whole tensor
            out.copy_(data)
            covered += 1
            continue
        overlap = _intersect(target, box)
        if overlap is None:
            continue
        dst, src = overlap
        out[tuple(dst)] = data[tuple(src)].to(dtype)
        covered += int(np.prod([s.stop - s.start for s in dst]))
    if covered != needed:
        raise RuntimeError(f"checkpoint entry {fqn!r}: the saved pieces cover {covered} of the "
                           f"{needed} elements of region offsets={list(target[0])} "
                           f"lengths={list(target[1])}; the checkpoint is damaged")
    return out


def full_box(shape: Sequence[int]) -> Box:
    """The box of a whole tensor."""
    return tuple(0 for _ in shape), tuple(int(s) for s in shape)


def assemble_shards(fqn: str, sharding: str, shape: Sequence[int],
                    pieces: Sequence[Tuple[Box, torch.Tensor]],
                    dtype: torch.dtype) -> List[torch.Tensor]:
    """One padded host shard per device of this process (device-id order) of a tensor laid
    out as ``sharding``, assembled from ``pieces``; replicas of a tile share one tensor."""
    cache: Dict[Box, torch.Tensor] = {}
    shards = []
    mine = _process_span.local_devices()
    for s in device_shards(sharding, shape):
        if s.device not in mine:
            continue
        if s.box not in cache:
            cache[s.box] = assemble(fqn, s.box, s.padded_shape, pieces, dtype)
        shards.append(cache[s.box])
    return shards
