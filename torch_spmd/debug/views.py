"""Views of the last step (executed or planned): per-device memory over the program and a
Chrome/Perfetto trace with one lane per device.

Both read the step's partitioned program through ``_C``: every device runs the same program, so
each device's curve and lane are alike (the views show them all so that a pod-sized plan looks
like the pod).
"""
import json
import os
from typing import Optional, Union

from .. import _C
from .. import runtime as xr


_COLLECTIVES = {"all_gather", "all_reduce", "reduce_scatter", "all_to_all", "collective_permute",
                "halo_exchange"}


def _label(op: str, scope: str) -> str:
    return f"{scope}: {op}" if scope else op


def memory_timeline(path: str, top: int = 8) -> dict:
    """Writes the last step's per-device live bytes over its program's instructions to
    ``path`` (``.json``; an ``.svg`` beside it, and a ``.png`` with matplotlib, which the
    project's test setup installs; torch_spmd itself does not depend on it)
    and returns the data: ``live_bytes`` (one entry per instruction), ``peak_bytes``,
    ``peak_index`` and ``peak_buffers`` (the ``top`` largest values live at the peak, each with
    its bytes, op and module path). The maximum is ``last_step_stats()['peak_bytes_per_device']``.
    """
    data = memory_timeline_data(top)
    base, ext = os.path.splitext(path)
    json_path = path if ext == ".json" else base + ".json"
    with open(json_path, "w") as f:
        json.dump(data, f, indent=1)
    with open(base + ".svg", "w") as f:
        f.write(memory_svg(data))
    try:
        _png(data, base + ".png")
    except ImportError:
        pass
    return data


def memory_timeline_data(top: int = 8) -> dict:
    """``memory_timeline``'s data, without writing anything."""
    t = _C._last_memory_timeline()
    if not t:
        raise RuntimeError("memory_timeline: no step has run or been planned yet")
    live = list(t["live_bytes"])
    peak_index = t["peak_index"]
    data = {
        "devices": xr.global_runtime_device_count(),
        "live_bytes": live,
        "ops": [_label(o, s) for o, s in zip(t["ops"], t["scopes"])],
        "peak_index": peak_index,
        "peak_bytes": live[peak_index] if live else 0,
        "peak_buffers": [dict(bytes=b, op=op, scope=scope, defined_at=d, last_use=u)
                         for b, op, scope, d, u in t["peak_buffers"][:top]],
    }
    return data


def memory_svg(data: dict, width: int = 720, height: int = 260) -> str:
    """The timeline as a self-contained SVG (no dependencies): bytes per device over the
    instructions, the peak marked and its largest buffers listed."""
    live = data["live_bytes"] or [0]
    peak = max(live) or 1
    n = max(len(live) - 1, 1)
    x0, y0, w, h = 60, 20, width - 80, height - 60
    pts = " ".join(f"{x0 + w * i / n:.1f},{y0 + h * (1 - b / peak):.1f}" for i, b in enumerate(live))
    px = x0 + w * data["peak_index"] / n
    lines = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height + 16 * 4}"'
             f' font-family="sans-serif" font-size="11">',
             f'<rect x="{x0}" y="{y0}" width="{w}" height="{h}" fill="none" stroke="#999"/>',
             f'<polyline points="{pts}" fill="none" stroke="#1f77b4" stroke-width="1.5"/>',
             f'<line x1="{px:.1f}" y1="{y0}" x2="{px:.1f}" y2="{y0 + h}" stroke="#d62728"'
             f' stroke-dasharray="4 3"/>',
             f'<text x="{x0}" y="{y0 - 6}">bytes per device ({data["devices"]} devices alike), '
             f'peak {peak / 2**20:.2f} MiB at instruction {data["peak_index"]}</text>',
             f'<text x="{x0}" y="{y0 + h + 14}">program instructions</text>']
    for i, b in enumerate(data["peak_buffers"][:4]):
        label = _label(b["op"], b["scope"]).replace("&", "&amp;").replace("<", "&lt;")
        lines.append(f'<text x="{x0}" y="{y0 + h + 32 + 16 * i}">{b["bytes"] / 2**20:.2f} MiB '
                     f'{label}</text>')
    lines.append("</svg>")
    return "\n".join(lines)


def _png(data: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 3))
    ax.plot([b / 2**20 for b in data["live_bytes"]])
    ax.axvline(data["peak_index"], color="red", linestyle="--")
    ax.set_xlabel("program instruction")
    ax.set_ylabel("MiB per device")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def trace(path: str, hardware: Union[str, dict, None] = None,
          devices: Optional[int] = None, measured: Optional[bool] = None) -> dict:
    """Writes the last step as a Chrome/Perfetto trace (``chrome://tracing``, ui.perfetto.dev):
    one lane per device (the first ``devices``, all by default), ops and collectives as slices
    named with their module paths.

    ``measured`` (default: whenever the last step was executed, not planned): the emulator's
    wall time of each instruction of the per-device program, per device (devices computing the
    same replicated result share one kernel call and its time), back to back. Otherwise the
    cost model's schedule on ``hardware`` (default: the plan's, else ``'host'``): what a pod
    would take, ops on a compute thread and collectives on a communication thread of each lane,
    each at the time the two-stream schedule starts it. Returns the trace dict."""
    from ..plan.hardware import resolve
    from ..plan import _active_hardware
    profile = _C._last_run_profile()
    if measured is None:
        measured = bool(profile)
    if measured:
        if not profile:
            raise RuntimeError("trace(measured=True): the last step was planned, not executed")
        return _measured_trace(path, profile, devices)
    hw = resolve(hardware if hardware is not None else (_active_hardware() or "host"))
    stats = _C._last_step_stats()
    est = _C._estimate_last_step(hw)
    slices = []
    for (op, _, _, nbytes, dtype, scope, _), seconds, start in zip(
            stats["op_costs"], est["op_seconds"], est["op_start"]):
        slices.append((_label(op, scope), "op", lambda d, s=seconds: s,
                       dict(bytes=nbytes, dtype=dtype), start))
    for c, t in zip(stats["collectives"], est["collective_seconds"]):
        slices.append((_label(c["kind"], c.get("scope", "")), "collective",
                       lambda d, s=t["seconds"]: s,
                       dict(axes=c["axes"], group_size=c["group_size"], bytes=c["bytes"],
                            crosses_hosts=t["crosses_hosts"],
                            crosses_processes=c["crosses_processes"], algorithm=t["algorithm"],
                            exposed_seconds=t["exposed_seconds"]), t["start"]))
    return _write_trace(path, slices, devices,
                        dict(times="predicted", hardware=hw["name"],
                             predicted_step_seconds=est["step_seconds"]))


def _measured_trace(path: str, profile: list, devices: Optional[int]) -> dict:
    slices = []
    for op, scope, internal, seconds in profile:
        kind = "collective" if internal and op.split("::")[-1] in _COLLECTIVES else "op"
        slices.append((_label(op, scope), kind, lambda d, s=seconds: s[d], {}, None))
    return _write_trace(path, slices, devices,
                        dict(times="measured on the emulator", instructions=len(profile)))


_THREADS = {"op": (0, "compute"), "collective": (1, "communication")}


def _write_trace(path: str, slices: list, devices: Optional[int], other: dict) -> dict:
    """One lane per device, `slices` ((name, category, seconds of device d, args, start)) in
    each: back to back on one thread when start is None, else from `start` seconds on the
    thread of their category (a schedule: compute and communication run side by side);
    written as Chrome trace JSON."""
    scheduled = any(start is not None for *_, start in slices)
    trace_events = []
    for d in range(devices or xr.global_runtime_device_count()):
        trace_events.append(dict(name="process_name", ph="M", pid=d, tid=0,
                                 args=dict(name=f"device {d}")))
        if scheduled:
            for tid, thread in _THREADS.values():
                trace_events.append(dict(name="thread_name", ph="M", pid=d, tid=tid,
                                         args=dict(name=thread)))
        t = 0.0
        for name, cat, seconds_of, args, start in slices:
            seconds = seconds_of(d)
            if start is not None:
                t = start
            tid = _THREADS[cat][0] if scheduled else 0
            trace_events.append(dict(name=name, cat=cat, ph="X", pid=d, tid=tid, ts=t * 1e6,
                                     dur=max(seconds * 1e6, 0.001), args=args))
            t += seconds
    data = dict(traceEvents=trace_events, displayTimeUnit="ms", otherData=other)
    with open(path, "w") as f:
        json.dump(data, f)
    return data
