"""Hardware presets for plan mode's cost model (``plan/hardware.h``,
``plan/cost_model.h``), with sources.

Every number is per device (a TPU chip or a GPU). Fields:

- ``peak_flops_bf16``: dense bf16 matmul FLOP/s; ``peak_flops_fp32``: what an fp32 matmul gets
  by default (TPUs: XLA's default precision runs fp32 matmuls as one bf16 pass, so the bf16
  peak; GPUs: PyTorch's default, TF32 off, the plain fp32 peak); ``peak_flops_fp8``: dense FP8
  matmul FLOP/s (``torch._scaled_mm``, Float8 linears), 0 where the chip has no FP8 matrix
  units (A100, the TPUs here): FP8 matmuls then run at the bf16 rate;
- ``matmul_efficiency``: the fraction of that peak large matmuls achieve (kernel efficiency,
  clocks under a power cap); ``matmul_tile``: each GEMM extent (M, N, K) is padded to a multiple
  of it, so small and thin matmuls also waste the padding (TPU: the MXU's side, 128, 256 on
  v6e; GPU: 128, the M x N block of cuBLAS/CUTLASS bf16 tensor-core kernels for large GEMMs,
  K is consumed in chunks of 32-64 so padding it to 128 overstates the loss for K < 128);
  0 turns the shape term off; ``matrix_units``: a GPU's SMs, over which a GEMM's M x N output
  tiles run in waves: a GEMM with fewer tiles than SMs, or a part-full last wave, leaves SMs
  idle (wave quantization; the kernel may halve its tile side where that fills them better, as
  cuBLAS does for small problems); 0 (TPUs, the default) leaves it out;
- ``hbm_bytes``, ``hbm_bandwidth`` (bytes/s), ``hbm_efficiency`` (the fraction of it kernels
  achieve);
- the interconnect, two levels. A *domain* is what one fast interconnect joins: a GPU host
  (``devices_per_host``, NVLink) or a TPU slice (``devices_per_slice``, ICI); device ids are
  laid out domain by domain; 0: every device in one domain. ``ring_bandwidth``: bytes/s a
  device sends along a ring inside a domain (a TPU torus dimension's two links; a GPU's
  per-direction NVLink bandwidth). Across domains each device has its own share of the
  network: ``cross_host_bandwidth`` (a GPU's InfiniBand/RoCE NIC) or ``dcn_bandwidth`` (a TPU
  chip's share of its host's data-center network NICs). ``torus_dims``: 2 or 3 for a TPU
  slice's ICI torus (collectives run a ring per torus dimension: fewer latency steps), 0 for a
  switch (NVLink);
- ``link_latency``: seconds per algorithm step (order of magnitude, from vendor and benchmark
  reports: ICI and NVLink a few microseconds);
- ``all_gather_prefetch``: how many all-gathers may be issued ahead of the compute that reads
  them (FSDP's ``limit_all_gathers`` keeps 2 in flight); 0: no limit. A scheduling setting, not
  hardware; every preset leaves it at 0.
- ``overlap_grad_reduce``: whether gradient reductions (a gradient made by the backward and
  reduced for the optimizer: data parallelism's all-reduce, FSDP's reduce-scatter) run during
  the backward as each gradient is made (True, every preset: PyTorch DDP's buckets, FSDP, XLA)
  or only once the backward is done (False: Megatron-LM's data parallelism and distributed
  optimizer without ``--overlap-grad-reduce``, its default). A property of the training
  framework, like ``all_gather_prefetch``.

- the host: ``host_devices`` devices share a host of ``host_memory_bytes`` memory, which values
  offloaded from their memory take (``torch_spmd.memory``; a plan that offloads more than a
  host holds does not fit); ``host_bandwidth``: bytes/s of each device's link to its host (PCIe)
  one way, which the copies cross. Without them (a user's dict): 32 GB/s, one device per host,
  host memory not checked.
- ``fused_memory``: the runtime compiles and fuses elementwise ops, so that a value with one
  reader, made by a pointwise op or read by one, is never held in device memory
  (``torch_spmd.runtime.set_fused_memory``): TPU presets True (XLA), GPU presets False (eager
  PyTorch; ``Plan(fused_memory=True)`` for torch.compile).
- ``kernel_overhead``: seconds the host takes to issue one kernel; the device cannot run an op
  before the host has issued it (eager PyTorch on GPUs; 0 for XLA's compiled TPU programs).
- ``collective_matmul_bytes``: the runtime decomposes a tensor-parallel matmul's all-gather or
  reduce-scatter of at least this many bytes per device into a ring of collective-permutes
  overlapping partial matmuls (``torch_spmd.runtime.set_collective_matmul``); a plan on the
  preset partitions so (``Plan(collective_matmul=...)`` overrides it). TPU presets: 1 MiB (XLA's
  async collective fusion and windowed einsums, on in MaxText's XLA flags); GPU presets: None
  (off: torchtitan's async tensor parallelism and Megatron's ``--tp-comm-overlap`` are
  options; pass ``collective_matmul=True`` to plan with them).

**Fitted constants.** ``benchmarks/plan_fidelity.py`` fits at most two numbers per preset on
the measured runs of ``../shared/plan_calibration`` (never per model or per row), and they are
published here:
- ``a100-80gb`` (and ``a100-40gb``, the same chip): ``matmul_efficiency`` 0.63 and
  ``kernel_overhead`` 48 us, fitted on vTrain's 720 Megatron-LM runs (1-8 A100s, fp16, full
  recomputation; grid search over 0.55-0.95 and 25-55 us, on an even third of the rows, then
  on all of them; refitted (0.62 -> 0.66) when the step became the smooth maximum of host and
  device near balance, plan/cost_model.h, and 0.66 -> 0.63 when host-link transfers stopped
  delaying the links' collectives in the step schedule; 48 us held both times; both held again
  when Megatron's runs were planned reducing gradients after the backward, as it does). 0.63 is the
  achieved fraction of the peak over Megatron-LM's GEMMs after padding and wave quantization; 48 us is the host's time per kernel
  of an eager PyTorch training step with Python-level modules and full recomputation (vTrain's
  small models are host-bound at micro-batch 1: about 44 ms per 12-layer micro-step, whatever
  the TP degree).
- The exponent of that smooth maximum, 3, is fitted once on the same rows (2-4 tried; on an
  even third, then checked on the rest) and holds for every preset with a kernel overhead.
- ``tpu-v4``: ``matmul_efficiency`` 0.76, fitted on MaxText's 22B/52B FSDP runs (64-512 chips;
  XLA issues one program per step: no kernel overhead; 0.77 before collectives used every torus
  dimension a group spans).
- ``tpu-v5e`` 0.85, ``tpu-v5p`` 0.86, ``tpu-v6e`` 0.80 (``matmul_efficiency``), each fitted on
  its few-shot rows of ``published_runs_few_shot.csv`` (v5e: MaxText 16B FSDP 256 and 128B
  FSDP 16 x TP 16 with q/k/v offloaded; v5p: 32B FSDP 16 x TP 4 and 512B FSDP 64 x TP 8; v6e:
  tpu-recipes' Llama 3.1 8B on 8 chips, host-offloaded), with collective matmul and host
  offloading as those runs used them (``plan_fidelity.py --fit``, grid 0.40-0.95).
- ``h100-80gb``: ``matmul_efficiency`` 0.51, fitted on Megatron-LM's H100 weak-scaling row (GPT
  1.7B on 48 H100s, data parallel with the distributed optimizer); ``kernel_overhead`` is the
  A100's. (The step's closing all-gather of the updated parameters counts as exposed, where
  Megatron's --overlap-param-gather hides it behind the next step's forward: the constant
  carries that too.)
- ``h100-96gb``: ``matmul_efficiency`` 0.48, fitted on torchtitan's two Llama 3.1 8B FSDP runs
  (8 GPUs, selective activation checkpointing; eager and torch.compile, which plan the same
  program: 0.48 splits the error between them, -6% and +8%). The 500 W cap and torchtitan's
  eager kernels are in it; ``kernel_overhead`` is transferred from the A100 (a property of
  eager PyTorch's host, which these large-kernel rows cannot measure).

**Transferred constants.** A preset without a measured run of its own takes the fitted
constants of its family's calibrated chip, not the peak: no chip runs a training step at 100%
of its peak, and the fraction a software stack achieves moves much less between generations
than the peak does. ``h200`` takes ``h100-80gb``'s (the same Hopper SMs at 700 W; not
``h100-96gb``'s, whose 500 W cap the 700 W parts do not have): against one real H200
(``benchmarks/gpu_check.py``, not fitted on) these predict its steps -30% to +4%, where the
A100's 0.66 it took before predicted them 8-37% too fast. A measured ceiling for comparison: one H200's bf16 8192^3 matmul runs at 0.79 of its peak
(``benchmarks/gpu_check.py``); a training step's matmuls average less. Give your own numbers
in a dict when you have measured your pod: ``plan.resolve(dict(plan.resolve("v5p"),
matmul_efficiency=...))``.

Sources (public spec sheets, read 2026):
- TPU v4: cloud.google.com/tpu/docs/v4 (275 TFLOP/s bf16, 32 GiB HBM2 at 1,200 GB/s, 3-D torus,
  pods of 4,096 chips, the largest slice), Jouppi et al., ISCA 2023 (ICI 2,400 Gbit/s per chip
  = 300 GB/s over 6 links, 50 GB/s each; 128x128 MXUs). Google publishes no per-chip DCN
  figure for v4: we assume v5p's 50 Gbit/s (6.25 GB/s); override it if you know yours.
- TPU v5e: cloud.google.com/tpu/docs/v5e and /v6e (197 TFLOP/s bf16, 16 GiB at 819 GB/s, 2-D
  torus, ICI 1,600 Gbit/s per chip = 200 GB/s over 4 links, 256-chip pods = the largest
  slice, 8 chips and 2 x 100 Gbit/s NICs per host = 25 Gbit/s = 3.125 GB/s DCN per chip,
  128x128 MXUs).
- TPU v5p: cloud.google.com/tpu/docs/v5p (459 TFLOP/s bf16, 95 GiB at 2,765 GB/s, 3-D torus,
  ICI 4,800 Gbit/s per chip = 600 GB/s over 6 links, DCN 50 Gbit/s = 6.25 GB/s per chip, the
  largest single slice 6,144 chips of an 8,960-chip pod; 128x128 MXUs).
- TPU v6e (Trillium): cloud.google.com/tpu/docs/v6e (918 TFLOP/s bf16, 32 GB at 1,640 GB/s,
  ICI 3,584 Gbit/s per chip = 448 GB/s over 4 ports, 112 GB/s each; 2-D torus, 256-chip pods
  = the largest slice; 8 chips and 4 x 200 Gbit/s NICs per host = 100 Gbit/s = 12.5 GB/s DCN
  per chip); 256x256 MXUs (jax-ml.github.io/scaling-book/tpus).
- A100 40GB / 80GB SXM: NVIDIA A100 datasheet (312 TFLOP/s bf16 dense, 19.5 TFLOP/s fp32,
  40 GB HBM2 at 1,555 GB/s / 80 GB HBM2e at 2,039 GB/s, NVLink 3 600 GB/s bidirectional = 300
  GB/s per direction, 8 per HGX host, 8x HDR 200 Gbit/s InfiniBand per host = 25 GB/s per GPU);
  108 SMs (NVIDIA A100 Tensor Core GPU Architecture whitepaper, 2020). H100 SXM5 and H200: 132
  SMs (NVIDIA H100 Tensor Core GPU Architecture whitepaper, 2022).
- H100 80GB SXM: NVIDIA H100 datasheet (989 TFLOP/s bf16 dense, 67 TFLOP/s fp32, 80 GB HBM3 at
  3.35 TB/s, NVLink 4 900 GB/s bidirectional = 450 GB/s per direction, 8 per HGX host,
  8x NDR 400 Gbit/s InfiniBand per host = 50 GB/s per GPU); FP8 1,979 TFLOP/s dense (the
  datasheet's 3,958 with sparsity, halved), twice the bf16 rate, as on every Hopper part.
- H100 96GB (HBM2e, 500 W; the part of torchtitan's published benchmarks, Meta's Grand Teton
  hosts): torchtitan benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md (96 GB HBM2e at 2.4
  TB/s, 8 per host on NVLink, 400 Gbit/s RDMA per GPU = 50 GB/s, 500 W power limit);
  TechPowerUp's GPU database, "NVIDIA H100 SXM5 96 GB" (62.08 TFLOP/s fp32 against the 80 GB
  SXM5's 66.91: a lower boost clock), so its dense bf16 peak is 989.4 x 62.08 / 66.91 = 918
  TFLOP/s (FP8: twice that, 1,836). The 500 W cap lowers sustained clocks further: that
  belongs to matmul_efficiency.
- H200 SXM: NVIDIA H200 datasheet (141 GB HBM3e at 4.8 TB/s, 989 TFLOP/s bf16 dense, 1,979
  FP8 dense, 67 TFLOP/s fp32, NVLink 4 as H100); HGX H200 reference hosts: 8 GPUs, 8x NDR 400 Gbit/s NICs =
  50 GB/s per GPU.
- Hosts (public machine types, read 2026; the host links are assumed PCIe where Google publishes
  none): TPU v4 hosts hold 4 chips and about 400 GB (PCIe Gen3 x16 assumed: 16 GB/s per chip);
  v5e ct5lp-hightpu-8t 8 chips, 384 GB; v5p ct5p-hightpu-4t 4 chips, 448 GB; v6e
  ct6e-standard-8t 8 chips, 1,440 GB (v5e/v5p/v6e: PCIe Gen4 x16 assumed, 32 GB/s per chip);
  NVIDIA DGX A100 1 TB (40 GB parts) / 2 TB (80 GB), DGX H100 and HGX H200 2 TB, 8 GPUs each,
  PCIe Gen4 x16 (A100, 32 GB/s) and Gen5 x16 (H100, H200, 64 GB/s) per GPU.
- ``host``: measured on this machine when first asked for (fp32 matmul peak with every core,
  memory copy bandwidth); the emulated devices share the host, so it has no interconnect of
  its own: collectives are memory copies.
"""
import functools
import time
from typing import Dict, Union

GB = 1e9
GIB = 1 << 30

# A user's own dict without efficiencies: the peak (module docstring, "Fitted constants").
PLACEHOLDER_EFFICIENCY = 1.0
# XLA on TPUs overlaps tensor-parallel collectives of at least this size with their matmuls
# (module docstring, ``collective_matmul_bytes``).
TPU_COLLECTIVE_MATMUL_BYTES = 1 << 20


def _tpu(peak, hbm_bytes, hbm_bandwidth, link_bandwidth, torus_dims, slice_chips, dcn_bandwidth,
         host, tile=128, matmul_efficiency=PLACEHOLDER_EFFICIENCY):
    chips, memory, pcie = host
    return dict(peak_flops_bf16=peak, peak_flops_fp32=peak, host_devices=chips,
                host_memory_bytes=memory, host_bandwidth=pcie,
                matmul_efficiency=matmul_efficiency, matmul_tile=tile, hbm_bytes=hbm_bytes,
                hbm_bandwidth=hbm_bandwidth, hbm_efficiency=PLACEHOLDER_EFFICIENCY,
                ring_bandwidth=2 * link_bandwidth, torus_dims=torus_dims,
                devices_per_slice=slice_chips, dcn_bandwidth=dcn_bandwidth, link_latency=5e-6,
                collective_matmul_bytes=TPU_COLLECTIVE_MATMUL_BYTES, fused_memory=True)


def _gpu(peak_bf16, peak_fp32, hbm_bytes, hbm_bandwidth, nvlink_bandwidth, nic_bandwidth, sms,
         host_memory, pcie, matmul_efficiency=PLACEHOLDER_EFFICIENCY, kernel_overhead=0.0,
         peak_fp8=0.0):
    return dict(peak_flops_bf16=peak_bf16, peak_flops_fp32=peak_fp32, peak_flops_fp8=peak_fp8,
                host_devices=8,
                host_memory_bytes=host_memory, host_bandwidth=pcie,
                matmul_efficiency=matmul_efficiency, kernel_overhead=kernel_overhead,
                matmul_tile=128, matrix_units=sms, hbm_bytes=hbm_bytes,
                hbm_bandwidth=hbm_bandwidth, hbm_efficiency=PLACEHOLDER_EFFICIENCY,
                ring_bandwidth=nvlink_bandwidth, devices_per_host=8,
                cross_host_bandwidth=nic_bandwidth, link_latency=3e-6)


# Fitted on the calibration rows, and transferred to the same family's chips without rows
# of their own (module docstring, "Fitted constants", "Transferred constants").
A100_FITTED = dict(matmul_efficiency=0.63, kernel_overhead=48e-6)
TPU_V4_FITTED = dict(matmul_efficiency=0.76)
TPU_V5E_FITTED = dict(matmul_efficiency=0.85)
TPU_V5P_FITTED = dict(matmul_efficiency=0.86)
TPU_V6E_FITTED = dict(matmul_efficiency=0.80)
H100_96GB_FITTED = dict(matmul_efficiency=0.48, kernel_overhead=A100_FITTED["kernel_overhead"])
H100_80GB_FITTED = dict(matmul_efficiency=0.51, kernel_overhead=A100_FITTED["kernel_overhead"])

# Hosts: (chips per host, host memory, each chip's host link one way); module docstring.
TPU_V4_HOST = (4, 400 * GB, 16 * GB)
TPU_V5E_HOST = (8, 384 * GB, 32 * GB)
TPU_V5P_HOST = (4, 448 * GB, 32 * GB)
TPU_V6E_HOST = (8, 1440 * GB, 32 * GB)
PCIE4, PCIE5 = 32 * GB, 64 * GB

PRESETS: Dict[str, dict] = {
    "tpu-v4": _tpu(275e12, 32 * GIB, 1200 * GB, 50 * GB, 3, 4096, 6.25 * GB, TPU_V4_HOST,
                   **TPU_V4_FITTED),
    "tpu-v5e": _tpu(197e12, 16 * GIB, 819 * GB, 50 * GB, 2, 256, 3.125 * GB, TPU_V5E_HOST,
                    **TPU_V5E_FITTED),
    "tpu-v5p": _tpu(459e12, 95 * GIB, 2765 * GB, 100 * GB, 3, 6144, 6.25 * GB, TPU_V5P_HOST,
                    **TPU_V5P_FITTED),
    "tpu-v6e": _tpu(918e12, 32 * GB, 1640 * GB, 112 * GB, 2, 256, 12.5 * GB, TPU_V6E_HOST,
                    tile=256, **TPU_V6E_FITTED),
    "a100-40gb": _gpu(312e12, 19.5e12, 40 * GB, 1555 * GB, 300 * GB, 25 * GB, 108, 1000 * GB,
                      PCIE4, **A100_FITTED),
    "a100-80gb": _gpu(312e12, 19.5e12, 80 * GB, 2039 * GB, 300 * GB, 25 * GB, 108, 2000 * GB,
                      PCIE4, **A100_FITTED),
    "h100-80gb": _gpu(989e12, 67e12, 80 * GB, 3350 * GB, 450 * GB, 50 * GB, 132, 2000 * GB,
                      PCIE5, peak_fp8=1979e12, **H100_80GB_FITTED),
    "h100-96gb": _gpu(918e12, 62e12, 96 * GB, 2400 * GB, 450 * GB, 50 * GB, 132, 2000 * GB,
                      PCIE5, peak_fp8=1836e12, **H100_96GB_FITTED),
    "h200": _gpu(989e12, 67e12, 141 * GB, 4800 * GB, 450 * GB, 50 * GB, 132, 2000 * GB, PCIE5,
                 peak_fp8=1979e12, **H100_80GB_FITTED),
}
ALIASES = {"v4": "tpu-v4", "v5e": "tpu-v5e", "v5p": "tpu-v5p", "v6e": "tpu-v6e",
           "trillium": "tpu-v6e", "a100": "a100-80gb", "h100": "h100-80gb", "tpu_v4": "tpu-v4",
           "a100-80GB": "a100-80gb", "a100-40GB": "a100-40gb", "h100-80GB": "h100-80gb",
           "h100-96GB": "h100-96gb", "h200-141gb": "h200"}
REQUIRED = ("peak_flops_bf16", "hbm_bytes", "hbm_bandwidth", "ring_bandwidth")
# Fields that name the same thing for GPU hosts and TPU slices: give one of each pair.
DOMAIN_FIELDS = (("devices_per_host", "devices_per_slice"),
                 ("cross_host_bandwidth", "dcn_bandwidth"))


@functools.lru_cache(maxsize=1)
def measure_host() -> dict:
    """This machine: fp32 matmul peak (best of a few 1024^3 products, every core) and memory
    copy bandwidth (best of a few 64 MiB copies)."""
    import torch
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t)
    flops = 2 * 1024 ** 3 / best
    src = torch.empty(16 << 20)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t)
    bandwidth = 2 * src.numel() * 4 / best  # read and write
    return dict(peak_flops_bf16=flops, peak_flops_fp32=flops, hbm_bytes=_host_memory(),
                hbm_bandwidth=bandwidth, ring_bandwidth=bandwidth / 2,
                cross_host_bandwidth=bandwidth / 2, link_latency=1e-6, devices_per_host=0)


def _host_memory() -> int:
    import os
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def resolve(hardware: Union[str, dict]) -> dict:
    """A preset by name (``'tpu-v4'``, ``'tpu-v5e'``, ``'tpu-v5p'``, ``'tpu-v6e'``,
    ``'a100-40gb'``, ``'a100-80gb'``, ``'h100-80gb'``, ``'h100-96gb'``, ``'h200'``, ``'host'``),
    or the user's own dict with at least ``peak_flops_bf16``, ``hbm_bytes``, ``hbm_bandwidth``
    and ``ring_bandwidth`` (the other fields default as in the module docstring: efficiencies
    1.0, no tile padding, one interconnect domain). Returns a new dict with a ``name``."""
    if isinstance(hardware, str):
        key = ALIASES.get(hardware, hardware).lower()
        if key == "host":
            return _with_defaults(dict(measure_host(), name="host"))
        if key not in PRESETS:
            raise ValueError(f"unknown hardware {hardware!r}; expected one of "
                             f"{sorted(PRESETS) + ['host']} or a dict of its numbers")
        return _with_defaults(dict(PRESETS[key], name=key))
    if not isinstance(hardware, dict):
        raise TypeError(f"hardware must be a preset name or a dict, got {type(hardware).__name__}")
    missing = [k for k in REQUIRED if k not in hardware]
    if missing:
        raise ValueError(f"hardware dict lacks {missing}; it needs {list(REQUIRED)}")
    hw = _with_defaults(dict(hardware))
    for k in ("peak_flops_bf16", "peak_flops_fp32", "hbm_bytes", "hbm_bandwidth",
              "ring_bandwidth", "cross_host_bandwidth", "dcn_bandwidth"):
        if k in hw and not hw[k] > 0:
            raise ValueError(f"hardware {k} must be positive, got {hw[k]!r}")
    if "peak_flops_fp8" in hw and not hw["peak_flops_fp8"] >= 0:
        raise ValueError(f"hardware peak_flops_fp8 must be >= 0 (0: no FP8 units), got "
                         f"{hw['peak_flops_fp8']!r}")
    for k in ("matmul_efficiency", "hbm_efficiency"):
        if not 0 < hw[k] <= 1:
            raise ValueError(f"hardware {k} is a fraction in (0, 1], got {hw[k]!r}")
    return hw


def _with_defaults(hw: dict) -> dict:
    for host, slice_ in DOMAIN_FIELDS:
        if host in hw and slice_ in hw:
            raise ValueError(f"hardware gives both {host} and {slice_}: the same field for a "
                             f"GPU host and a TPU slice; give one")
    hw.setdefault("name", "custom")
    hw.setdefault("peak_flops_fp32", hw["peak_flops_bf16"])
    hw.setdefault("matmul_efficiency", 1.0)
    hw.setdefault("matmul_tile", 0)
    hw.setdefault("matrix_units", 0)
    hw.setdefault("hbm_efficiency", 1.0)
    hw.setdefault("kernel_overhead", 0.0)
    if "devices_per_slice" not in hw:
        hw.setdefault("devices_per_host", 0)
    if "dcn_bandwidth" not in hw:
        hw.setdefault("cross_host_bandwidth", hw["ring_bandwidth"])
    hw.setdefault("torus_dims", 0)
    hw.setdefault("link_latency", 0.0)
    hw.setdefault("all_gather_prefetch", 0)
    hw.setdefault("overlap_grad_reduce", True)
    hw.setdefault("host_devices", 1)
    hw.setdefault("host_memory_bytes", 0)
    hw.setdefault("host_bandwidth", 32 * GB)
    hw.setdefault("collective_matmul_bytes", None)
    hw.setdefault("fused_memory", False)
    for k in ("overlap_grad_reduce", "fused_memory"):
        if not isinstance(hw[k], bool):
            raise ValueError(f"hardware {k} must be True or False, got {hw[k]!r}")
    cm = hw["collective_matmul_bytes"]
    if cm is not None and (isinstance(cm, bool) or not isinstance(cm, int) or cm < 0):
        raise ValueError(f"hardware collective_matmul_bytes must be None (off) or an int >= 0, "
                         f"got {cm!r}")
    return hw
