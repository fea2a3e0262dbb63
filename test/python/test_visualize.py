"""xs.visualize_sharding / visualize_tensor_sharding (rich tables of device layouts)."""
import gc
import os

os.environ.setdefault("SPMD_NUM_DEVICES", "8")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

import torch_spmd  # noqa: E402
import torch_spmd.distributed.spmd as xs  # noqa: E402
import torch_spmd.runtime as xr  # noqa: E402
from torch_spmd.distributed.spmd.debugging import visualize_sharding  # noqa: E402

N = 8


pytestmark = pytest.mark.usefixtures("eight_devices")



def cell_texts(table):
    """The text of every cell, row by row."""
    return [[col._cells[r].renderable.renderable for col in table.columns]
            for r in range(table.row_count)]


def run(capsys, sharding, **kwargs):
    table = visualize_sharding(sharding, use_color=False, **kwargs)
    out = capsys.readouterr().out
    assert out.startswith(f"Visualizing {sharding} (showing up to the first two dimensions)\n")
    return table, out


def test_tiled_2d(capsys):
    table, out = run(capsys, "{devices=[4,2]0,1,2,3,4,5,6,7}")
    assert cell_texts(table) == [["SPMD 0", "SPMD 1"], ["SPMD 2", "SPMD 3"],
                                 ["SPMD 4", "SPMD 5"], ["SPMD 6", "SPMD 7"]]
    assert "│ SPMD 2 │ SPMD 3 │" in out  # drawn as a 4x2 grid


def test_tiled_transposed(capsys):
    table, _ = run(capsys, "{devices=[2,4]0,2,4,6,1,3,5,7}")
    assert cell_texts(table) == [["SPMD 0", "SPMD 2", "SPMD 4", "SPMD 6"],
                                 ["SPMD 1", "SPMD 3", "SPMD 5", "SPMD 7"]]


def test_tiled_1d_is_one_row(capsys):
    table, out = run(capsys, "{devices=[8]0,1,2,3,4,5,6,7}")
    assert cell_texts(table) == [[f"SPMD {i}" for i in range(N)]]
    assert all(len(line) <= 80 for line in out.splitlines()[1:])  # fits max_width


def test_partial(capsys):
    table, out = run(capsys, "{devices=[2,1,4]0,2,4,6,1,3,5,7 last_tile_dim_replicate}")
    assert cell_texts(table) == [["SPMD [0, 2, 4, 6]"], ["SPMD [1, 3, 5, 7]"]]
    assert "SPMD [1, 3, 5, 7]" in out


def test_partial_1d(capsys):
    table, _ = run(capsys, "{devices=[4,2]0,1,2,3,4,5,6,7 last_tile_dim_replicate}")
    assert cell_texts(table) == [["SPMD [0, 1]", "SPMD [2, 3]", "SPMD [4, 5]", "SPMD [6, 7]"]]


def test_replicated(capsys):
    table, _ = run(capsys, "{replicated}")
    assert cell_texts(table) == [["SPMD [0, 1, 2, 3, 4, 5, 6, 7]"]]


def test_rank3_lists_deeper_tiles_in_cells(capsys):
    table, _ = run(capsys, "{devices=[2,2,2]0,4,2,6,1,5,3,7}")
    assert cell_texts(table) == [["SPMD [0, 4]", "SPMD [2, 6]"], ["SPMD [1, 5]", "SPMD [3, 7]"]]


def test_cells_are_drawn_as_pytorch_xla_draws_them(capsys):
    """One space and one line around each label whatever scale and min_width say (PyTorch/XLA
    computes sizes from them but never uses them), no background colors; a replicated value's
    one cell lists its devices even on one device."""
    table = visualize_sharding("{devices=[4,2]0,1,2,3,4,5,6,7}", use_color=True, scale=2,
                               min_width=12, max_width=60)
    capsys.readouterr()
    assert table.row_count == 4 and len(table.columns) == 2
    for column in table.columns:
        for cell in column._cells:
            assert (cell.top, cell.right, cell.bottom, cell.left) == (1, 1, 1, 1)
            assert cell.style.bgcolor is None
    _, out = run(capsys, "{devices=[4,2]0,1,2,3,4,5,6,7}")
    assert "│ SPMD 2 │ SPMD 3 │" in out


def test_replicated_on_one_device_lists_it(capsys, monkeypatch):
    monkeypatch.setattr(xr, "global_runtime_device_count", lambda: 1)
    table, _ = run(capsys, "{replicated}")
    assert cell_texts(table) == [["SPMD [0]"]]


@pytest.mark.parametrize("bad", [
    "", "{devices=[3]0,1}", "nonsense", "{devices=[2,2]0,1,2,2}", "{devices=[2,2]0,1,2,3",
    "{manual}",
])
def test_malformed_strings(bad, capsys):
    with pytest.raises(ValueError):
        visualize_sharding(bad)
    assert capsys.readouterr().out == ""


def test_visualize_tensor_sharding(capsys):
    mesh = xs.Mesh(np.arange(N), (2, 4), ("x", "y"))
    t = torch.randn(8, 4).to(torch_spmd.device())
    st = xs.mark_sharding(t, mesh, ("y", "x"))
    for arg in (t, st):
        table = xs.visualize_tensor_sharding(arg, use_color=False)
        out = capsys.readouterr().out
        assert out.startswith("Visualizing {devices=[4,2]0,4,1,5,2,6,3,7} (showing up to")
        assert cell_texts(table) == [["SPMD 0", "SPMD 4"], ["SPMD 1", "SPMD 5"],
                                     ["SPMD 2", "SPMD 6"], ["SPMD 3", "SPMD 7"]]
    with pytest.raises(ValueError, match="not sharded"):
        xs.visualize_tensor_sharding(torch.randn(2).to(torch_spmd.device()))
