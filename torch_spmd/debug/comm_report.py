"""``comm_report()``: the last step's collectives per module, forward and backward apart, each
kind with its count and bytes per device (CommDebugMode counts collectives per module; this also
weighs them). Collectives carry the module path of the op they were emitted for
(``torch_spmd.debug.module_scope``)."""
from collections import OrderedDict
from typing import Optional

from .. import _C

TOP = "(top level)"
_BACKWARD = " (backward)"


def comm_report(stats: Optional[dict] = None, print_table: bool = True) -> dict:
    """``{module: {"forward"|"backward": {kind: {"count": n, "bytes": b}}}}`` for the last step
    (or ``stats``, a ``last_step_stats()`` dict), bytes per device (each collective's input
    buffer, as ``last_step_stats`` reports it). Modules appear in program order; ops outside any
    module are under ``"(top level)"``, optimizer updates under ``"optimizer"`` (pass
    ``"update"``). The reduction of a pending sum (a gradient's reduce-scatter or all-reduce)
    is under the module whose op produced the sum (its backward), not the op that reads it. With
    ``print_table`` a table is printed too (rich, when installed)."""
    stats = stats if stats is not None else _C._last_step_stats()
    report: "OrderedDict[str, dict]" = OrderedDict()
    for c in stats["collectives"]:
        scope = c.get("scope", "")
        direction = "forward"
        if scope.endswith(_BACKWARD):
            scope, direction = scope[:-len(_BACKWARD)], "backward"
        elif scope == "optimizer":
            direction = "update"
        module = scope or TOP
        kinds = report.setdefault(module, {"forward": {}, "backward": {}}).setdefault(direction, {})
        entry = kinds.setdefault(c["kind"], {"count": 0, "bytes": 0})
        entry["count"] += 1
        entry["bytes"] += c["bytes"]
    if print_table:
        _print(report)
    return dict(report)


def total_bytes(report: dict) -> int:
    """Sum of the bytes of every collective in a comm_report."""
    return sum(e["bytes"] for d in report.values() for kinds in d.values() for e in kinds.values())


def report_rows(report: dict):
    """(module, pass, collective kind, count, bytes per device) per entry of a comm_report."""
    for module, directions in report.items():
        for direction, kinds in directions.items():
            for kind, e in kinds.items():
                yield module, direction, kind, e["count"], e["bytes"]


def _print(report: dict) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print(f"{'module':<40} {'pass':<9} {'collective':<19} {'count':>6} {'bytes/device':>14}")
        for row in report_rows(report):
            print(f"{row[0]:<40} {row[1]:<9} {row[2]:<19} {row[3]:>6} {row[4]:>14}")
        return
    table = Table(title="collectives per module (bytes per device)")
    for col, justify in (("module", "left"), ("pass", "left"), ("collective", "left"),
                         ("count", "right"), ("bytes/device", "right")):
        table.add_column(col, justify=justify)
    for module, direction, kind, count, nbytes in report_rows(report):
        table.add_row(module, direction, kind, str(count), f"{nbytes:,}")
    Console().print(table)
