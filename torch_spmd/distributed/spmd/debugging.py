"""Sharding visualization with ``rich`` (``torch_xla.distributed.spmd.debugging``).

``visualize_sharding`` draws the devices of a sharding over the first two tensor dims: one cell
per tile, holding its device id (tiled), the ids of its replicas (partially replicated), or all
ids (replicated). Unlike PyTorch/XLA, 1-D shardings work (one row), and tiles of dims beyond the
second are listed in their cell instead of being dropped.
"""
from typing import List

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

# Background colors for cells, cycled; cells with the same devices get the same color.
_PALETTE = ["#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd", "#31a354",
            "#756bb1", "#636363", "#e6550d", "#969696", "#9c9ede", "#cedb9c", "#e7ba52",
            "#ad494a", "#a55194"]


def _device_grid(sharding: str) -> List[List[List[int]]]:
    """Rows of cells, each cell the device ids that hold that tile of the first two dims."""
    if not sharding:
        raise ValueError("sharding has no value (the tensor is not sharded)")
    ta = _C._parse_sharding_spec(sharding)  # ValueError: "... is not organized as expected"
    if ta["manual"]:
        raise ValueError(f"sharding {sharding} cannot be visualized: a manual sharding has no "
                         "device layout")
    if ta["replicated"]:
        return [[list(range(xr.global_runtime_device_count()))]]
    dims = list(ta["dims"])
    tensor_dims = dims[:-1] if ta["last_tile_dim_replicate"] else dims
    # Trailing axis: every device of a cell (tiles of deeper dims, then replicas).
    tiles = np.array(ta["devices"]).reshape(tensor_dims[:2] + [-1])
    if len(tensor_dims) == 0:
        return [[tiles.flatten().tolist()]]
    if len(tensor_dims) == 1:
        return [[cell.tolist() for cell in tiles]]
    return [[cell.tolist() for cell in row] for row in tiles]


def visualize_sharding(sharding: str,
                       use_color: bool = True,
                       scale: float = 1.,
                       min_width: int = 9,
                       max_width: int = 80):
    """Prints the device layout of ``sharding`` (XLA text form, e.g.
    ``'{devices=[4,2]0,1,2,3,4,5,6,7}'``) as a table and returns the ``rich.table.Table``.

    Args:
      sharding: the sharding text; malformed text raises ValueError.
      use_color: color cells by device set (when the console supports color), else draw lines.
      scale: scales the cell height.
      min_width / max_width: bounds of a cell's width; max_width is also the console width.
    """
    if not RICH_ENABLED:
        raise ValueError("`visualize_sharding` requires `rich` to be installed.")
    grid = _device_grid(sharding)
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
    height = max(int(3 * scale), 1)
    colors = {}
    for row in grid:
        cells = []
        for devices in row:
            label = str(devices[0]) if len(devices) == 1 else str(devices)
            entry = f"{xr.device_type()} {label}"
            # Wide enough for its text if possible, at least min_width, and the row must fit
            # in max_width columns (one border character per cell plus one).
            available = max((max_width - len(row) - 1) // len(row), len(entry))
            width = min(max(min_width, int(6 * scale), len(entry) + 2), available)
            left, rest = divmod(max(width - len(entry), 0), 2)
            top, rest_v = divmod(height - 1, 2)
            padding = (top, left + rest, top + rest_v, left)
            style = rich.style.Style()
            if use_color:
                color = colors.setdefault(tuple(devices), _PALETTE[len(colors) % len(_PALETTE)])
                style = rich.style.Style(bgcolor=color, color="white")
            cells.append(
                rich.padding.Padding(
                    rich.align.Align(entry, "center", vertical="middle"), padding, style=style))
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
