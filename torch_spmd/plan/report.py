"""``PlanReport``: what one planned (or executed) step costs per device, and how long it would
take on the plan's hardware."""
import re
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from .. import _C
from .pipeline_schedule import last_schedules

ASSUMPTIONS = [
    "Each local op takes max(compute, memory) (roofline). Compute: FLOPs / (peak FLOP/s for its "
    "dtype); a contraction (matmul, convolution) runs at matmul_efficiency x the peak, x the "
    "real fraction of its GEMM with each extent padded to matmul_tile and, on GPUs, x the "
    "fraction of the SMs its output tiles keep busy. Memory: bytes read and written / (HBM "
    "bandwidth x hbm_efficiency). FLOPs come from the op's sharding rule (iteration space), "
    "bytes from its local operand and result shapes; views take no time.",
    "Pointwise ops fuse: a pointwise op reading a value that a pointwise op produced for it "
    "alone does not pay that value's HBM write and read. Other fusions (into reductions, matmul "
    "prologues and epilogues) are not modelled: the memory-bound part stays an upper bound.",
    "Collectives: the fastest of ring, tree (all-reduce) and hierarchical algorithms for where "
    "the group sits: inside a domain (a GPU host's NVLink; a TPU slice's ICI torus, using every "
    "torus dimension the group spans) at ring_bandwidth; across domains each member's own "
    "cross-domain link, m members of a domain using m links in parallel (NCCL across GPU hosts "
    "runs ring or tree, not the hierarchical algorithm); one link latency per algorithm step. "
    "With collective matmul on (TPU presets), a tensor-parallel matmul's all-gather or "
    "reduce-scatter runs as a ring of collective-permutes between partial matmuls.",
    "The step is the critical path of the compute stream and the links (predicted_step_seconds): "
    "ops in program order (communication-free ops first), collectives one at a time per link "
    "direction (the earliest in the program among those whose input is ready), copies to and "
    "from host memory on the host link's own streams (a reload one op ahead of its reader); "
    "the compute stream waits for a transfer only at its first reader. On presets with a "
    "kernel_overhead (eager GPU runtimes) the host issues each kernel and the step is at least "
    "the smooth maximum of the host's issue time and the device's. overlapped_step_seconds "
    "(full overlap) and no_overlap_step_seconds (none) bound it.",
    "No input pipeline, compiler scheduling beyond that, or cross-step overlap (an optimizer's "
    "parameter all-gather hidden behind the next step's forward counts as exposed).",
    "Memory: parameters of the step stay live throughout it, every other value from its "
    "definition to its last use; the data of tensors the step does not read stays resident. "
    "With fused memory (compiling runtimes: the TPU presets) a single-use elementwise value "
    "lives inside its reader's fusion, and in-place updates share their operand's buffer. "
    "reserved_bytes_per_device models eager PyTorch's CUDA caching allocator (pools, segment "
    "sizes, best fit, splits) over the same allocations.",
    "MFU = model FLOPs (every op of the global program once, less the ops that compute a "
    "value again: activation checkpointing's recomputed forward) / (step time x devices x peak "
    "FLOP/s of the dtype most of those FLOPs use), also less a pipeline's bubble (its stages' "
    "work on no micro-batch). HFU (hardware FLOPs utilisation) counts the recomputation and "
    "the bubble too.",
]
TOP_MODULES = 10  # rows of time_by_module; the rest are summed into one "(other modules)" row


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
    compute_bound_seconds: float
    memory_bound_seconds: float
    host_bound_seconds: float
    communication_seconds: float
    exposed_communication_seconds: float
    predicted_step_seconds: float
    overlapped_step_seconds: float
    no_overlap_step_seconds: float
    time_by_module: List[dict]
    mfu: float
    fits: bool
    peak_op: str
    out_of_memory: Optional[str] = None
    hfu: float = 0.0                # utilisation with recomputed FLOPs counted
    recomputed_flops: float = 0.0   # of model_flops: values computed again
    replicated_fallback_ops: dict = field(default_factory=dict)  # op -> count, no sharding rule
    planned: bool = True            # a planned step (else an executed one, priced on `hardware`)
    pipeline: List[dict] = field(default_factory=list)  # per pipeline that ran: see _pipelines
    # Offloaded values (torch_spmd.memory.offload, save_on_cpu): the most bytes of host memory
    # one device's take at once, what its host holds for all its devices, and the time of the
    # copies over the host link (on streams of their own).
    # What an eager runtime's caching allocator reserves for the step (its freed blocks kept:
    # torch.cuda.max_memory_reserved, what torchtitan logs); the fit is judged on the peak.
    reserved_bytes_per_device: int = 0
    host_bytes_per_device: int = 0
    host_bytes_per_host: int = 0
    host_transfer_seconds: float = 0.0
    assumptions: List[str] = field(default_factory=lambda: list(ASSUMPTIONS))

    def as_dict(self) -> dict:
        return dict(self.__dict__)

    def __str__(self) -> str:
        hw = self.hardware
        peak, resident = self.peak_bytes_per_device[0], self.resident_bytes_per_device[0]
        what = "Plan on" if self.planned else "Executed step on"
        priced = "" if self.planned else ", priced"
        lines = [
            f"{what} {self.num_devices} x {hw['name']}{priced} "
            f"({hw['peak_flops_bf16'] / 1e12:.3g} TFLOP/s bf16, {_fmt_bytes(hw['hbm_bytes'])} HBM)",
            f"  peak memory per device      {_fmt_bytes(peak):>14}   (at {self.peak_op})",
            f"  resident after the step     {_fmt_bytes(resident):>14}",
            f"  reserved by an allocator    {_fmt_bytes(self.reserved_bytes_per_device):>14}"
            f"   (eager PyTorch's caching allocator keeps freed blocks)",
            *([f"  offloaded to host memory    {_fmt_bytes(self.host_bytes_per_device):>14}"
               f"   per device ({_fmt_bytes(self.host_bytes_per_host)} per host; "
               f"{_fmt_seconds(self.host_transfer_seconds)} over the host links)"]
              if self.host_bytes_per_device else []),
            f"  fits                        {'yes' if self.fits else 'NO':>14}",
            f"  FLOPs per device            {self.flops_per_device:>14.4g}",
            f"  model FLOPs                 {self.model_flops:>14.4g}",
            f"  compute                     {_fmt_seconds(self.compute_seconds):>14}"
            f"   (compute-bound {_fmt_seconds(self.compute_bound_seconds)}, "
            f"memory-bound {_fmt_seconds(self.memory_bound_seconds)}; "
            f"waiting for the host {_fmt_seconds(self.host_bound_seconds)})",
            f"  communication               {_fmt_seconds(self.communication_seconds):>14}"
            f"   (exposed {_fmt_seconds(self.exposed_communication_seconds)})",
            f"  predicted step              {_fmt_seconds(self.predicted_step_seconds):>14}"
            f"   (full overlap {_fmt_seconds(self.overlapped_step_seconds)}, "
            f"no overlap {_fmt_seconds(self.no_overlap_step_seconds)})",
            f"  MFU                         {self.mfu * 100:>13.2f}%",
        ]
        if self.recomputed_flops:
            lines.append(f"  HFU (recomputation counted) {self.hfu * 100:>13.2f}%"
                         f"   ({self.recomputed_flops:.4g} FLOPs recomputed)")
        if self.out_of_memory:
            lines.append(f"  {self.out_of_memory}")
        if self.replicated_fallback_ops:
            ops = ", ".join(f"{op} x{n}" for op, n in sorted(self.replicated_fallback_ops.items()))
            lines.append(f"  replicated (no sharding rule): {ops}")
        for q in self.pipeline:
            lines.append(
                f"  pipeline {q['module'] or '(root)'}: {q['stages']} stages x "
                f"{q['microbatches']} micro-batches x {q['repeats']} repeats, "
                f"{q['iterations']} iterations of {_fmt_seconds(q['loop_seconds'] / q['iterations'])}; "
                f"bubble {q['bubble_fraction'] * 100:.1f}% of the loop "
                f"((S-1)/(RM+S-1) = {q['bubble_fraction_formula'] * 100:.1f}%), "
                f"{_fmt_seconds(q['bubble_seconds'])} of the step; "
                f"{q['permutes']} collective-permutes, {_fmt_bytes(q['permute_bytes'])} in all; "
                f"peak per stage {_fmt_bytes(q['peak_bytes_per_stage'])}")
        if self.collectives:
            lines.append("  collectives:")
            lines.append(f"    {'kind':<18} {'axes':<16} {'group':>5} {'bytes/device':>14} "
                         f"{'count':>6} {'time':>12} {'exposed':>12}  algorithm")
            for c in self.collectives:
                lines.append(f"    {c['kind']:<18} {','.join(c['axes']):<16} {c['group_size']:>5} "
                             f"{_fmt_bytes(c['bytes']):>14} {c['count']:>6} "
                             f"{_fmt_seconds(c['seconds']):>12} "
                             f"{_fmt_seconds(c['exposed_seconds']):>12}  {c['algorithm']}"
                             + ("  [across processes]" if c.get("crosses_processes") else ""))
        if self.time_by_module:
            lines.append("  time by module (its ops + the communication the step waits for):")
            lines.append(f"    {'module':<40} {'step share':>12} {'compute':>12} "
                         f"{'exposed comm':>12} {'comm':>12}")
            for m in self.time_by_module:
                lines.append(f"    {m['module'][-40:]:<40} {_fmt_seconds(m['seconds']):>12} "
                             f"{_fmt_seconds(m['compute_seconds']):>12} "
                             f"{_fmt_seconds(m['exposed_communication_seconds']):>12} "
                             f"{_fmt_seconds(m['communication_seconds']):>12}")
        return "\n".join(lines)


def _time_by_module(stats: dict, est: dict, top: int = TOP_MODULES) -> List[dict]:
    """Per module path: its ops' time, its collectives' time and the part of it the compute
    stream waits for; `seconds` (ops + exposed communication) adds up to the predicted step
    over all modules. The `top` largest, the rest summed into one row."""
    rows: "OrderedDict[str, dict]" = OrderedDict()

    def row(scope: str) -> dict:
        name = scope or "(no module)"
        return rows.setdefault(name, dict(module=name, seconds=0.0, compute_seconds=0.0,
                                          exposed_communication_seconds=0.0,
                                          communication_seconds=0.0))
    for op, seconds in zip(stats["op_costs"], est["op_seconds"]):
        row(op[5])["compute_seconds"] += seconds
    for c, t in zip(stats["collectives"], est["collective_seconds"]):
        r = row(c.get("scope", ""))
        r["communication_seconds"] += t["seconds"]
        r["exposed_communication_seconds"] += t["exposed_seconds"]
    for r in rows.values():
        r["seconds"] = r["compute_seconds"] + r["exposed_communication_seconds"]
    ranked = sorted(rows.values(), key=lambda r: -r["seconds"])
    if len(ranked) <= top:
        return ranked
    other = dict(module="(other modules)", seconds=0.0, compute_seconds=0.0,
                 exposed_communication_seconds=0.0, communication_seconds=0.0)
    for r in ranked[top:]:
        for k in ("seconds", "compute_seconds", "exposed_communication_seconds",
                  "communication_seconds"):
            other[k] += r[k]
    return ranked[:top] + [other]


def _iteration_of(scope: str, base: str, iterations: int) -> Tuple[int, bool]:
    """(t, inside its blocks) when `scope` is `<base><t>` (a pipeline iteration), a module
    below it or its backward; (-1, False) otherwise. Read off the scope's text: no search over
    the iterations for each of a step's ops."""
    if not scope.startswith(base):
        return -1, False
    digits = re.match(r"\d+", scope[len(base):])
    if digits is None:
        return -1, False
    t, rest = int(digits.group()), scope[len(base) + digits.end():]
    if t >= iterations or (rest and rest[0] not in ". "):
        return -1, False
    return t, rest.startswith(".")


def _pipelines(stats: dict, est: dict) -> List[dict]:
    """Per pipeline that ran in the step (torch_spmd.distributed.pipeline): its schedule and,
    from the planned times of each iteration's work (forward and backward), the bubble: the
    time of each iteration times the share of stages that worked on no micro-batch in it."""
    out = []
    for path, sched in last_schedules().items():
        base = f"{path}.iteration" if path else "iteration"
        seconds = [0.0] * sched.iterations
        flops = [0.0] * sched.iterations  # model FLOPs
        permutes, permute_bytes = 0, 0
        for op, sec in zip(stats["op_costs"], est["op_seconds"]):
            t, _ = _iteration_of(op[5], base, sched.iterations)
            if t >= 0:
                seconds[t] += sec
                flops[t] += op[2]
        for c, timing in zip(stats["collectives"], est["collective_seconds"]):
            t, in_blocks = _iteration_of(c.get("scope", ""), base, sched.iterations)
            if t < 0:
                continue
            # An iteration's work: its ops, the blocks' own collectives (tensor parallelism,
            # collective matmul's permutes among them) and the shift between stages. Not a sum
            # over iterations reduced once (the weight gradients'), which the last iteration's
            # scope only carries.
            if not in_blocks:
                if c["kind"] != "collective-permute":
                    continue
                permutes += 1
                permute_bytes += c["bytes"]
            seconds[t] += timing["exposed_seconds"]
        loop = sum(seconds)
        if loop <= 0:
            continue  # it did not run in this step
        idle_share = [(sched.stages - busy) / sched.stages for busy in sched.busy_stages]
        idle = sum(sec * share for sec, share in zip(seconds, idle_share))
        out.append(dict(module=path, stages=sched.stages, microbatches=sched.microbatches,
                        repeats=sched.repeats, iterations=sched.iterations,
                        loop_seconds=loop, bubble_seconds=idle, bubble_fraction=idle / loop,
                        bubble_fraction_formula=sched.bubble_fraction, permutes=permutes,
                        permute_bytes=permute_bytes,
                        bubble_flops=sum(f * share for f, share in zip(flops, idle_share)),
                        peak_bytes_per_stage=stats["device_peak_bytes"]))
    return out


def build_report(num_devices: int, hardware: dict, planned: bool = True) -> PlanReport:
    """The report of the last step (planned, or executed when not ``planned``) on
    ``hardware``. Collectives are grouped by kind, axes and size, the most costly first."""
    stats = _C._last_step_stats()
    est = _C._estimate_last_step(hardware)
    groups: "OrderedDict[tuple, dict]" = OrderedDict()
    for c, t in zip(stats["collectives"], est["collective_seconds"]):
        key = (c["kind"], tuple(c["axes"]), c["group_size"], c["bytes"])
        g = groups.setdefault(key, dict(kind=c["kind"], axes=list(c["axes"]),
                                        group_size=c["group_size"], bytes=c["bytes"], count=0,
                                        seconds=0.0, exposed_seconds=0.0,
                                        crosses_hosts=t["crosses_hosts"],
                                        crosses_processes=c["crosses_processes"],
                                        algorithm=t["algorithm"]))
        g["count"] += 1
        g["seconds"] += t["seconds"]
        g["exposed_seconds"] += t["exposed_seconds"]
    # The dtype most model FLOPs use decides the peak MFU is measured against.
    # (FP8 matmuls: the FP8 peak, the bf16 one on chips without FP8 units, as plan/hardware.h.)
    peaks = {"fp32": hardware["peak_flops_fp32"], "half": hardware["peak_flops_bf16"],
             "fp8": hardware.get("peak_flops_fp8") or hardware["peak_flops_bf16"]}
    by_dtype = {}
    for _, _, model_flops, _, dtype, *_ in stats["op_costs"]:
        kind = "fp8" if dtype.startswith("f8") else "half" if dtype in ("bf16", "f16") else "fp32"
        by_dtype[kind] = by_dtype.get(kind, 0.0) + model_flops
    peak = peaks[max(("fp32", "half", "fp8"), key=lambda k: by_dtype.get(k, 0.0))]
    step = est["step_seconds"]
    capacity = step * num_devices * peak
    recomputed = stats.get("recomputed_flops", 0.0)
    pipelines = _pipelines(stats, est)
    # A pipeline's stages compute on no micro-batch in the bubble: not model FLOPs either
    # (recomputation taken to be spread alike over the bubble and the rest).
    bubble = sum(q["bubble_flops"] for q in pipelines) / stats["model_flops"] \
        if stats["model_flops"] else 0.0
    hfu = stats["model_flops"] / capacity if step > 0 else 0.0
    mfu = (stats["model_flops"] - recomputed) * (1 - bubble) / capacity if step > 0 else 0.0
    device_peak = stats["device_peak_bytes"]
    fits = device_peak <= hardware["hbm_bytes"]
    oom = None
    if not fits:
        oom = (f"does not fit: every device (device 0 first) needs {_fmt_bytes(device_peak)} at "
               f"{stats['peak_op']} but has {_fmt_bytes(hardware['hbm_bytes'])} "
               f"({device_peak} > {int(hardware['hbm_bytes'])} bytes)")
    host_device = stats.get("host_peak_bytes_per_device", 0)
    host_devices = min(int(hardware.get("host_devices", 1)), num_devices)
    host_total = host_device * host_devices
    host_capacity = hardware.get("host_memory_bytes") or 0
    if host_capacity and host_total > host_capacity:
        fits = False
        oom = ((oom + "; ") if oom else "does not fit: ") + (
            f"each host holds {_fmt_bytes(host_total)} offloaded for its {host_devices} devices "
            f"but has {_fmt_bytes(host_capacity)} ({host_total} > {int(host_capacity)} bytes)")
    return PlanReport(
        num_devices=num_devices, hardware=dict(hardware),
        peak_bytes_per_device=[device_peak] * num_devices,
        resident_bytes_per_device=[stats["resident_bytes_per_device"]] * num_devices,
        flops_per_device=stats["flops_per_device"], model_flops=stats["model_flops"],
        collectives=sorted(groups.values(), key=lambda g: (-g["seconds"], -g["bytes"] * g["count"])),
        compute_seconds=est["compute_seconds"],
        compute_bound_seconds=est["compute_bound_seconds"],
        memory_bound_seconds=est["memory_bound_seconds"],
        host_bound_seconds=est["host_bound_seconds"],
        communication_seconds=est["communication_seconds"],
        exposed_communication_seconds=est["exposed_communication_seconds"],
        predicted_step_seconds=step, overlapped_step_seconds=est["overlapped_step_seconds"],
        no_overlap_step_seconds=est["no_overlap_step_seconds"],
        time_by_module=_time_by_module(stats, est), mfu=mfu, fits=fits,
        peak_op=stats["peak_op"], out_of_memory=oom, hfu=hfu, recomputed_flops=recomputed,
        replicated_fallback_ops=dict(stats["replicated_fallback_ops"]), planned=planned,
        pipeline=pipelines, reserved_bytes_per_device=stats.get("reserved_bytes_per_device", 0),
        host_bytes_per_device=host_device, host_bytes_per_host=host_total,
        host_transfer_seconds=est["host_transfer_seconds"])
