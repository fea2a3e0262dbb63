"""Hardware presets for plan mode's cost model (``partition/cost_model.h``), with sources.

Every number is per device (a TPU chip or a GPU). Fields:

- ``peak_flops_bf16``: dense bf16 matmul FLOP/s; ``peak_flops_fp32``: what an fp32 matmul gets
  by default (TPUs: XLA's default precision runs fp32 matmuls as one bf16 pass, so the bf16
  peak; GPUs: PyTorch's default, TF32 off, the plain fp32 peak);
- ``hbm_bytes``, ``hbm_bandwidth`` (bytes/s);
- ``ring_bandwidth``: bytes/s a device sends along a ring inside one interconnect domain (a
  TPU slice's ICI torus: the two links of one torus dimension; a GPU host's NVLink: the
  per-direction NVLink bandwidth); ``cross_host_bandwidth``: bytes/s per device for groups that
  span hosts (GPUs: the host's InfiniBand NICs shared by its GPUs); ``devices_per_host``
  (0: one interconnect for all devices, a TPU slice);
- ``link_latency``: seconds per ring step (order of magnitude, from vendor and benchmark
  reports: ICI and NVLink a few microseconds).

Sources (public spec sheets, read 2026):
- TPU v4: cloud.google.com/tpu/docs/v4 (275 TFLOP/s bf16, 32 GiB HBM2 at 1,200 GB/s, 3-D torus,
  ICI 2,400 Gbit/s per chip = 300 GB/s over 6 links, 50 GB/s each); Jouppi et al., ISCA 2023.
- TPU v5e: cloud.google.com/tpu/docs/v5e (197 TFLOP/s bf16, 16 GiB at 819 GB/s, 2-D torus,
  ICI 1,600 Gbit/s per chip = 200 GB/s over 4 links).
- TPU v5p: cloud.google.com/tpu/docs/v5p (459 TFLOP/s bf16, 95 GiB at 2,765 GB/s, 3-D torus,
  ICI 4,800 Gbit/s per chip = 600 GB/s over 6 links).
- A100 80GB SXM: NVIDIA A100 datasheet (312 TFLOP/s bf16 dense, 19.5 TFLOP/s fp32, 80 GB HBM2e
  at 2,039 GB/s, NVLink 3 600 GB/s bidirectional = 300 GB/s per direction, 8 per HGX host,
  8x HDR 200 Gbit/s InfiniBand per host = 25 GB/s per GPU).
- H100 80GB SXM: NVIDIA H100 datasheet (989 TFLOP/s bf16 dense, 67 TFLOP/s fp32, 80 GB HBM3 at
  3.35 TB/s, NVLink 4 900 GB/s bidirectional = 450 GB/s per direction, 8 per HGX host,
  8x NDR 400 Gbit/s InfiniBand per host = 50 GB/s per GPU).
- ``host``: measured on this machine when first asked for (fp32 matmul peak with every core,
  memory copy bandwidth); the emulated devices share the host, so it has no interconnect of
  its own: collectives are memory copies.
"""
import functools
import time
from typing import Dict, Union

GB = 1e9
GIB = 1 << 30

PRESETS: Dict[str, dict] = {
    "tpu-v4": dict(peak_flops_bf16=275e12, peak_flops_fp32=275e12, hbm_bytes=32 * GIB,
                   hbm_bandwidth=1200 * GB, ring_bandwidth=2 * 50 * GB,
                   cross_host_bandwidth=2 * 50 * GB, link_latency=5e-6, devices_per_host=0),
    "tpu-v5e": dict(peak_flops_bf16=197e12, peak_flops_fp32=197e12, hbm_bytes=16 * GIB,
                    hbm_bandwidth=819 * GB, ring_bandwidth=2 * 50 * GB,
                    cross_host_bandwidth=2 * 50 * GB, link_latency=5e-6, devices_per_host=0),
    "tpu-v5p": dict(peak_flops_bf16=459e12, peak_flops_fp32=459e12, hbm_bytes=95 * GIB,
                    hbm_bandwidth=2765 * GB, ring_bandwidth=2 * 100 * GB,
                    cross_host_bandwidth=2 * 100 * GB, link_latency=5e-6, devices_per_host=0),
    "a100-80gb": dict(peak_flops_bf16=312e12, peak_flops_fp32=19.5e12, hbm_bytes=80 * GB,
                      hbm_bandwidth=2039 * GB, ring_bandwidth=300 * GB,
                      cross_host_bandwidth=25 * GB, link_latency=3e-6, devices_per_host=8),
    "h100-80gb": dict(peak_flops_bf16=989e12, peak_flops_fp32=67e12, hbm_bytes=80 * GB,
                      hbm_bandwidth=3350 * GB, ring_bandwidth=450 * GB,
                      cross_host_bandwidth=50 * GB, link_latency=3e-6, devices_per_host=8),
}
ALIASES = {"v4": "tpu-v4", "v5e": "tpu-v5e", "v5p": "tpu-v5p", "a100": "a100-80gb",
           "h100": "h100-80gb", "tpu_v4": "tpu-v4", "a100-80GB": "a100-80gb",
           "h100-80GB": "h100-80gb"}
REQUIRED = ("peak_flops_bf16", "hbm_bytes", "hbm_bandwidth", "ring_bandwidth")


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
    """A preset by name (``'tpu-v4'``, ``'tpu-v5e'``, ``'tpu-v5p'``, ``'a100-80gb'``,
    ``'h100-80gb'``, ``'host'``), or the user's own dict with at least ``peak_flops_bf16``,
    ``hbm_bytes``, ``hbm_bandwidth`` and ``ring_bandwidth`` (the other fields default as in the
    module docstring). Returns a new dict with a ``name``."""
    if isinstance(hardware, str):
        key = ALIASES.get(hardware, hardware).lower()
        if key == "host":
            return dict(measure_host(), name="host")
        if key not in PRESETS:
            raise ValueError(f"unknown hardware {hardware!r}; expected one of "
                             f"{sorted(PRESETS) + ['host']} or a dict of its numbers")
        return dict(PRESETS[key], name=key)
    if not isinstance(hardware, dict):
        raise TypeError(f"hardware must be a preset name or a dict, got {type(hardware).__name__}")
    missing = [k for k in REQUIRED if k not in hardware]
    if missing:
        raise ValueError(f"hardware dict lacks {missing}; it needs {list(REQUIRED)}")
    hw = dict(hardware)
    hw.setdefault("name", "custom")
    hw.setdefault("peak_flops_fp32", hw["peak_flops_bf16"])
    hw.setdefault("cross_host_bandwidth", hw["ring_bandwidth"])
    hw.setdefault("link_latency", 0.0)
    hw.setdefault("devices_per_host", 0)
    for k in ("peak_flops_bf16", "peak_flops_fp32", "hbm_bytes", "hbm_bandwidth",
              "ring_bandwidth", "cross_host_bandwidth"):
        if not hw[k] > 0:
            raise ValueError(f"hardware {k} must be positive, got {hw[k]!r}")
    return hw
