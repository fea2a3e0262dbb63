"""``report(path)``: one self-contained HTML page about the last step (executed or planned):
the sharding of every parameter, the collectives per module, the memory timeline, and the
predicted step on the plan's hardware. No scripts, no external files: it opens anywhere."""
import html
from typing import Optional, Union

import torch

from .. import _C
from .. import runtime as xr
from .comm_report import comm_report, total_bytes
from .views import memory_svg, memory_timeline

_STYLE = """
body { font-family: sans-serif; margin: 24px; color: #222; }
h1 { font-size: 20px; } h2 { font-size: 16px; margin-top: 28px; }
table { border-collapse: collapse; font-size: 12px; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: left; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
pre { background: #f6f6f6; padding: 8px; font-size: 12px; }
"""


def _table(header, rows, numeric=()) -> str:
    out = ["<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in header) + "</tr>"]
    for row in rows:
        cells = []
        for i, v in enumerate(row):
            cls = ' class="n"' if i in numeric else ""
            cells.append(f"<td{cls}>{html.escape(str(v))}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


def _sharding_rows(model: torch.nn.Module):
    for name, p in model.named_parameters():
        if p.device.type != "spmd":
            continue
        shard = _C._shard_shape(p)
        nbytes = p.element_size()
        for d in shard:
            nbytes *= d
        yield (name, list(p.shape), str(p.dtype).replace("torch.", ""),
               _C._named_sharding(p) or "(replicated)", list(shard), f"{nbytes:,}")


def report(path: str, model: Optional[torch.nn.Module] = None,
           hardware: Union[str, dict, None] = None, title: str = "torch_spmd step") -> str:
    """Writes the page to ``path`` and returns its HTML. ``model``: the parameters to list (none
    when omitted); ``hardware``: for the predicted step (default the active plan's, else the
    measured host)."""
    from ..plan import _active_hardware, report_last_step
    hw = hardware if hardware is not None else (_active_hardware() or "host")
    stats = _C._last_step_stats()
    comm = comm_report(stats, print_table=False)
    memory = memory_timeline(path + ".memory.json")
    summary = report_last_step(hw)
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
             f"<style>{_STYLE}</style></head><body>",
             f"<h1>{html.escape(title)}: {xr.global_runtime_device_count()} devices</h1>",
             "<h2>Predicted step</h2>", f"<pre>{html.escape(str(summary))}</pre>"]
    if model is not None:
        parts += ["<h2>Parameters</h2>",
                  _table(["parameter", "global shape", "dtype", "mesh axes per dim", "shape per device",
                          "bytes per device"], _sharding_rows(model), numeric=(5,))]
    rows = []
    for module, directions in comm.items():
        for direction, kinds in directions.items():
            for kind, e in kinds.items():
                rows.append((module, direction, kind, e["count"], f"{e['bytes']:,}"))
    parts += ["<h2>Collectives per module</h2>",
              f"<p>{len(stats['collectives'])} collectives, {total_bytes(comm):,} bytes per device "
              f"in all.</p>",
              _table(["module", "pass", "collective", "count", "bytes per device"], rows,
                     numeric=(3, 4)),
              "<h2>Memory per device</h2>", memory_svg(memory),
              "<h2>Largest values at the peak</h2>",
              _table(["bytes", "op", "module", "defined at", "last use"],
                     [(f"{b['bytes']:,}", b["op"], b["scope"], b["defined_at"], b["last_use"])
                      for b in memory["peak_buffers"]], numeric=(0, 3, 4)),
              "</body></html>"]
    page = "\n".join(parts)
    with open(path, "w") as f:
        f.write(page)
    return page
