"""``PlanReport``: what one planned (or executed) step costs per device, and how long it would
take on the plan's hardware."""
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import List, Optional

from .. import _C

ASSUMPTIONS = [
    "Each local op takes max(FLOPs / peak FLOP/s for its dtype, bytes read and written / HBM "
    "bandwidth) (roofline); FLOPs come from the op's sharding rule (iteration space), bytes "
    "from its local operand and result shapes.",
    "Collectives follow the ring formulas: all-gather and reduce-scatter send (n-1)/n of the "
    "gathered buffer per device, all-reduce twice that; (n-1) link latencies per ring "
    "(2(n-1) for all-reduce); groups that span hosts use the cross-host bandwidth.",
    "No overlap of compute and communication (predicted_step_seconds); "
    "overlapped_step_seconds is the lower bound with full overlap.",
    "No kernel launch, host, input pipeline or compiler fusion effects: ops run one after "
    "another as the partitioned program lists them (XLA would fuse pointwise ops, so the "
    "memory-bound part is an upper bound).",
    "Memory: parameters of the step stay live throughout it, every other value from its "
    "definition to its last use; the data of tensors the step does not read stays resident.",
    "MFU = model FLOPs (every op of the global program once) / (step time x devices x peak "
    "FLOP/s of the dtype most of those FLOPs use).",
]


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.2f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


def _fmt_seconds(s: float) -> str:
    return f"{s * 1e3:.3f} ms" if s < 1 else f"{s:.3f} s"


@dataclass
class PlanReport:
    num_devices: int
    hardware: dict
    peak_bytes_per_device: List[int]
    resident_bytes_per_device: List[int]
    flops_per_device: float
    model_flops: float
    collectives: List[dict]
    compute_seconds: float
    communication_seconds: float
    predicted_step_seconds: float
    overlapped_step_seconds: float
    mfu: float
    fits: bool
    peak_op: str
    out_of_memory: Optional[str] = None
    assumptions: List[str] = field(default_factory=lambda: list(ASSUMPTIONS))

    def as_dict(self) -> dict:
        return dict(self.__dict__)

    def __str__(self) -> str:
        hw = self.hardware
        peak, resident = self.peak_bytes_per_device[0], self.resident_bytes_per_device[0]
        lines = [
            f"Plan on {self.num_devices} x {hw['name']} "
            f"({hw['peak_flops_bf16'] / 1e12:.0f} TFLOP/s bf16, {_fmt_bytes(hw['hbm_bytes'])} HBM)",
            f"  peak memory per device      {_fmt_bytes(peak):>14}   (at {self.peak_op})",
            f"  resident after the step     {_fmt_bytes(resident):>14}",
            f"  fits                        {'yes' if self.fits else 'NO':>14}",
            f"  FLOPs per device            {self.flops_per_device:>14.4g}",
            f"  model FLOPs                 {self.model_flops:>14.4g}",
            f"  compute                     {_fmt_seconds(self.compute_seconds):>14}",
            f"  communication               {_fmt_seconds(self.communication_seconds):>14}",
            f"  predicted step              {_fmt_seconds(self.predicted_step_seconds):>14}"
            f"   (full overlap: {_fmt_seconds(self.overlapped_step_seconds)})",
            f"  MFU                         {self.mfu * 100:>13.2f}%",
        ]
        if self.out_of_memory:
            lines.append(f"  {self.out_of_memory}")
        if self.collectives:
            lines.append("  collectives:")
            lines.append(f"    {'kind':<18} {'axes':<16} {'group':>5} {'bytes/device':>14} "
                         f"{'count':>6} {'time':>12}")
            for c in self.collectives:
                lines.append(f"    {c['kind']:<18} {','.join(c['axes']):<16} {c['group_size']:>5} "
                             f"{_fmt_bytes(c['bytes']):>14} {c['count']:>6} "
                             f"{_fmt_seconds(c['seconds']):>12}")
        return "\n".join(lines)


def build_report(num_devices: int, hardware: dict) -> PlanReport:
    """The report of the last step (planned or executed) on ``hardware``."""
    stats = _C._last_step_stats()
    est = _C._estimate_last_step(hardware)
    groups: "OrderedDict[tuple, dict]" = OrderedDict()
    for c, (seconds, crosses) in zip(stats["collectives"], est["collective_seconds"]):
        key = (c["kind"], tuple(c["axes"]), c["group_size"], c["bytes"])
        g = groups.setdefault(key, dict(kind=c["kind"], axes=list(c["axes"]),
                                        group_size=c["group_size"], bytes=c["bytes"], count=0,
                                        seconds=0.0, crosses_hosts=crosses))
        g["count"] += 1
        g["seconds"] += seconds
    # The dtype most model FLOPs use decides the peak MFU is measured against.
    by_dtype = {}
    for _, _, model_flops, _, dtype, *_ in stats["op_costs"]:
        half = dtype in ("bf16", "f16")
        by_dtype[half] = by_dtype.get(half, 0.0) + model_flops
    peak = hardware["peak_flops_bf16"] if by_dtype.get(True, 0) > by_dtype.get(False, 0) \
        else hardware["peak_flops_fp32"]
    step = est["step_seconds"]
    mfu = stats["model_flops"] / (step * num_devices * peak) if step > 0 else 0.0
    device_peak = stats["device_peak_bytes"]
    fits = device_peak <= hardware["hbm_bytes"]
    oom = None
    if not fits:
        oom = (f"does not fit: every device (device 0 first) needs {_fmt_bytes(device_peak)} at "
               f"{stats['peak_op']} but has {_fmt_bytes(hardware['hbm_bytes'])} "
               f"({device_peak} > {int(hardware['hbm_bytes'])} bytes)")
    return PlanReport(
        num_devices=num_devices, hardware=dict(hardware),
        peak_bytes_per_device=[device_peak] * num_devices,
        resident_bytes_per_device=[stats["resident_bytes_per_device"]] * num_devices,
        flops_per_device=stats["flops_per_device"], model_flops=stats["model_flops"],
        collectives=list(groups.values()), compute_seconds=est["compute_seconds"],
        communication_seconds=est["communication_seconds"], predicted_step_seconds=step,
        overlapped_step_seconds=est["overlapped_step_seconds"], mfu=mfu, fits=fits,
        peak_op=stats["peak_op"], out_of_memory=oom)
