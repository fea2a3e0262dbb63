"""Sharding visualization with ``rich`` (``torch_xla.distributed.spmd.debugging``).

``visualize_sharding`` draws the devices of a sharding over the first two tensor dims: one cell
per tile, holding its device id (tiled), the ids of its replicas (partially replicated), or all
ids (replicated). Unlike PyTorch/XLA, 1-D shardings work (one row), and tiles of dims beyond the
second are listed in their cell instead of being dropped.
"""
from typing import List, Tuple

import numpy as np

from ... import _C
from ... import runtime as xr
from .xla_sharded_tensor import XLAShardedTensor

try:
    import rich
    import rich.align
    import rich.box
    import rich.console
    import rich.padding
    import rich.style
    import rich.table
    RICH_ENABLED = True
except ImportError:  # rich is optional: only visualization needs it
    RICH_ENABLED = False

def _device_grid(sharding: str) -> Tuple[List[List[List[int]]], bool]:
    """Rows of cells, each cell the device ids that hold that tile of the first two dims; and
    whether cells are labelled by that list (replicated, partially replicated, deeper tiles)
    rather than by their one device, as PyTorch/XLA labels them."""
    if not sharding:
        raise ValueError("sharding has no value (the tensor is not sharded)")
    ta = _C._parse_sharding_spec(sharding)  # ValueError: "... is not organized as expected"
    if ta["manual"]:
        raise ValueError(f"sharding {sharding} cannot be visualized: a manual sharding has no "
                         "device layout")
    if ta["replicated"]:
        return [[list(range(xr.global_runtime_device_count()))]], True
    dims = list(ta["dims"])
    tensor_dims = dims[:-1] if ta["last_tile_dim_replicate"] else dims
    lists = ta["last_tile_dim_replicate"] or len(tensor_dims) > 2
    # Trailing axis: every device of a cell (tiles of deeper dims, then replicas).
    tiles = np.array(ta["devices"]).reshape(tensor_dims[:2] + [-1])
    if len(tensor_dims) == 0:
        return [[tiles.flatten().tolist()]], True
    if len(tensor_dims) == 1:
        return [[cell.tolist() for cell in tiles]], lists
    return [[cell.tolist() for cell in row] for row in tiles], lists


def visualize_sharding(sharding: str,
                       use_color: bool = True,
                       scale: float = 1.,
                       min_width: int = 9,
                       max_width: int = 80):
    """Prints the device layout of ``sharding`` (XLA text form, e.g.
    ``'{devices=[4,2]0,1,2,3,4,5,6,7}'``) as a table and returns the ``rich.table.Table``,
    drawn as PyTorch/XLA draws it: each cell its device (``'CPU 3'``) or its devices
    (``'CPU [0, 1]'``) with one space and one line around.

    Args:
      sharding: the sharding text; malformed text raises ValueError.
      use_color: without color support (or False), cells are separated by lines.
      scale, min_width: accepted for PyTorch/XLA's signature, which ignores them too.
      max_width: the console's width.
    """
    if not RICH_ENABLED:
        raise ValueError("`visualize_sharding` requires `rich` to be installed.")
    grid, lists = _device_grid(sharding)
    print(f"Visualizing {sharding} (showing up to the first two dimensions)")

    console = rich.console.Console(width=max_width)
    use_color = use_color and console.color_system is not None
    table = rich.table.Table(
        show_header=False,
        show_lines=not use_color,
        padding=0,
        highlight=not use_color,
        pad_edge=False,
        box=rich.box.SQUARE if not use_color else None)
    for row in grid:
        cells = []
        for devices in row:
            label = str(devices) if lists else str(devices[0])
            cells.append(
                rich.padding.Padding(
                    rich.align.Align(f"{xr.device_type()} {label}", "center", vertical="middle"),
                    (1, 1, 1, 1), style=rich.style.Style()))
        table.add_row(*cells)
    console.print(table, end="\n\n")
    return table


def construct_v1_sharding_str(t) -> str:
    """The sharding of ``t`` in XLA V1 text form (the only form this implementation uses)."""
    if isinstance(t, XLAShardedTensor):
        t = t.global_tensor
    return _C._get_sharding_spec(t)


def visualize_tensor_sharding(t, **kwargs):
    """``visualize_sharding`` of the sharding of ``t`` (an spmd tensor or XLAShardedTensor)."""
    return visualize_sharding(construct_v1_sharding_str(t), **kwargs)
