"""``report(path)``: one self-contained HTML page about the last step (executed or planned):
the sharding of every parameter (its annotation and its layout now), the ops that ran
replicated for want of a sharding rule, the collectives per module (the heaviest first), the
memory timeline, and the step priced on the plan's hardware (or the host's). No scripts, no
external files: it writes that one file and opens anywhere."""
import html
from typing import Optional, Union

import torch

from .. import _C
from .. import runtime as xr
from .comm_report import comm_report, report_rows, total_bytes
from .views import memory_svg, memory_timeline_data

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
        # The annotation is what the user asked for (and what in-place updates keep); a
        # parameter nobody annotated holds whatever layout the last step produced it in.
        yield (name, list(p.shape), str(p.dtype).replace("torch.", ""),
               _C._annotated_sharding(p) or "(none)", _C._named_sharding(p) or "(replicated)",
               list(shard), f"{nbytes:,}")


def report(path: str, model: Optional[torch.nn.Module] = None,
           hardware: Union[str, dict, None] = None, title: str = "torch_spmd step") -> str:
    """Writes the page to ``path`` and returns its HTML. ``model``: the parameters to list (none
    when omitted); ``hardware``: for the predicted step (default the active plan's, else the
    measured host)."""
    from ..plan import _active_hardware, build_report, resolve
    planned = _active_hardware() is not None
    hw = resolve(hardware if hardware is not None else (_active_hardware() or "host"))
    stats = _C._last_step_stats()
    comm = comm_report(stats, print_table=False)
    memory = memory_timeline_data()
    summary = build_report(xr.global_runtime_device_count(), hw, planned=planned)
    kind = "planned step" if planned else "executed step"
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
             f"<style>{_STYLE}</style></head><body>",
             f"<h1>{html.escape(title)}: {kind}, {xr.global_runtime_device_count()} devices</h1>",
             f"<h2>{'Predicted step' if planned else 'The step priced on ' + hw['name']}</h2>",
             f"<pre>{html.escape(str(summary))}</pre>",
             "<h2>Ops without a sharding rule (run replicated)</h2>",
             _table(["op", "count"], sorted(stats["replicated_fallback_ops"].items()), numeric=(1,))
             if stats["replicated_fallback_ops"] else "<p>None: every op ran sharded as its rule "
             "allows.</p>"]
    if model is not None:
        parts += ["<h2>Parameters</h2>",
                  _table(["parameter", "global shape", "dtype", "annotation (mark_sharding)",
                          "layout now", "shape per device", "bytes per device"],
                         _sharding_rows(model), numeric=(6,))]
    rows = [r[:4] + (f"{r[4]:,}",)
            for r in sorted(report_rows(comm), key=lambda r: -r[4])]  # the heaviest first
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
