"""Shard geometry of an XLA sharding string: which part of a tensor each device holds.

A *box* is ``(offsets, lengths)``: per dim, where a shard starts in the global tensor and how
many elements it covers. Used by the checkpoints (``distributed/checkpoint/_layout.py``) and by
multi-process SPMD's per-process batches (``_process_span``).
"""
import math
from typing import List, Sequence, Tuple

import numpy as np

from .. import _C

Box = Tuple[Tuple[int, ...], Tuple[int, ...]]


class DeviceShard:
    """Where device ``device`` keeps its shard: the unpadded ``box`` of the global tensor and
    the ``padded_shape`` of its buffer (uneven dims are padded to ``ceil(dim / tiles)``)."""
    __slots__ = ("device", "box", "padded_shape")

    def __init__(self, device: int, box: Box, padded_shape: Tuple[int, ...]):
        self.device = device
        self.box = box
        self.padded_shape = padded_shape


def device_shards(sharding: str, shape: Sequence[int]) -> List[DeviceShard]:
    """Every device's shard of a tensor of ``shape`` sharded as ``sharding`` (a tiled XLA
    sharding string), in device-id order.

    Computed from the tile assignment alone, without touching the data: device ``devices[p]``
    holds tile ``unravel(p, dims)``; a dim of size D in t tiles has shard size s = ceil(D/t) and
    tile i covers [min(i*s, D), min((i+1)*s, D)), as XLA and ``local_shards`` lay them out.
    """
    ta = _C._parse_sharding_spec(sharding)
    dims, devices = list(ta["dims"]), list(ta["devices"])
    rank = len(shape)
    tiles = dims[:rank]
    sizes = [math.ceil(d / t) for d, t in zip(shape, tiles)]
    out = []
    for position, device in enumerate(devices):
        coords = np.unravel_index(position, dims)
        offsets, lengths = [], []
        for d in range(rank):
            start = min(int(coords[d]) * sizes[d], shape[d])
            end = min(start + sizes[d], shape[d])
            offsets.append(start)
            lengths.append(end - start)
        out.append(DeviceShard(int(device), (tuple(offsets), tuple(lengths)), tuple(sizes)))
    out.sort(key=lambda s: s.device)
    return out
