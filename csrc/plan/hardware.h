// What the step-time model (plan/cost_model.h) knows about the hardware: per device peak
// FLOP/s and HBM, how much of them real kernels achieve, and a two-level interconnect (a fast
// domain, cross-domain links). Presets with their sources: torch_spmd/_impl/hardware.py.
#pragma once
#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace spmd::plan {

struct Hardware {
  std::string name;
  double peak_flops_bf16 = 0;  // per device, dense matmul
  double peak_flops_fp32 = 0;  // per device, what an fp32 matmul gets by default
  double peak_flops_fp8 = 0;   // per device, dense FP8 matmul; 0: no FP8 units (the bf16 rate)
  // Achieved fraction of the peak on large matmuls (kernel and clock losses), and each GEMM
  // extent (M, N, K) padded to a multiple of `matmul_tile`, the matrix unit's tile (a TPU MXU's
  // side; a GPU tensor-core kernel's block): small and thin matmuls waste the padding. 0: no
  // padding.
  double matmul_efficiency = 1;
  int64_t matmul_tile = 0;
  // Units that run a GEMM's output tiles side by side (a GPU's SMs): the tiles run in waves of
  // this many, and a GEMM with fewer tiles than units, or a last wave part full, leaves units
  // idle (wave quantization). The kernel may halve its tile side to fill the units better, as
  // cuBLAS picks smaller tiles for small problems. 0: not modelled (a TPU core's matrix units
  // take one tile at a time: padding only).
  int64_t matrix_units = 0;
  double hbm_bytes = 0;         // per device
  double hbm_bandwidth = 0;     // bytes/s per device
  double hbm_efficiency = 1;    // achieved fraction of hbm_bandwidth
  // Seconds the host takes to issue one kernel: a runtime that launches a kernel per op from
  // the host (eager PyTorch on a GPU: dispatch and launch) runs ahead of the device, but the
  // device cannot start an op before the host has issued it, which bounds models whose ops are
  // small (plan/step_schedule.h). 0 for compiled runtimes (XLA on TPUs issues a step's
  // fused program at once).
  double kernel_overhead = 0;
  // Interconnect. A domain is the devices one fast interconnect joins: a GPU host's NVLink, a
  // TPU slice's ICI torus. Inside one, a ring sends `ring_bandwidth` bytes/s per device; across
  // domains each device has `cross_domain_bandwidth` bytes/s of its own (a GPU's share of its
  // host's NICs, a TPU chip's share of its host's DCN NICs).
  int64_t devices_per_domain = 0;  // consecutive device ids; 0: every device in one domain
  double ring_bandwidth = 0;
  double cross_domain_bandwidth = 0;
  // Dimensions of the domain's torus (TPU ICI: 2 or 3), whose collectives run a ring per
  // dimension; 0: a switch (NVLink), one ring through the group.
  int torus_dims = 0;
  double link_latency = 0;  // seconds per algorithm step (one hop of a ring or a tree)
  // Each device's link to its host (PCIe), bytes/s one way: what offloaded values cross
  // (partition/offload.h); and the host memory they take, per host of `host_devices` devices.
  double host_bandwidth = 32e9;
  double host_memory_bytes = 0;  // 0: not known, not checked
  int64_t host_devices = 1;
  // At most this many all-gathers may be issued ahead of the compute that reads them (FSDP's
  // limit_all_gathers, XLA's overlap limits); 0: no limit (plan/step_schedule.h).
  int64_t all_gather_prefetch = 0;
  // Whether gradient reductions run during the backward, as each gradient is made (PyTorch
  // DDP's buckets, FSDP, XLA), or only once the backward is done (false: Megatron-LM's
  // data-parallel reduction and distributed optimizer without --overlap-grad-reduce):
  // CollectiveStat::after_backward, plan/step_schedule.h.
  bool overlap_grad_reduce = true;

  double PeakFlops(DType dtype) const {
    if (IsFloat8(dtype)) return peak_flops_fp8 > 0 ? peak_flops_fp8 : peak_flops_bf16;
    return dtype == DType::kBFloat16 || dtype == DType::kFloat16 ? peak_flops_bf16 : peak_flops_fp32;
  }
};

}  // namespace spmd::plan
