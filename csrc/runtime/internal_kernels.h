// Kernels for the spmd:: ops (collectives, device-dependent slicing and masking). Each kernel
// sees one value per device for every input and produces one per device for every output, so
// it can move data between devices. Registered by op name; the executor looks them up once.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "ir/internal_ops.h"
#include "ir/node.h"
#include "runtime/device_data.h"
#include "runtime/stacked.h"

namespace spmd::runtime {

using InternalKernel = std::function<std::vector<PerDevice>(
    const ir::Node& node, const std::vector<const PerDevice*>& inputs)>;

void RegisterInternalKernel(const std::string& qualified_name, InternalKernel kernel);
const InternalKernel* FindInternalKernel(const std::string& qualified_name);

// The same ops on device-batched values (stacked.h): every input and output holds all devices'
// shards as one stack, so a collective is a few tensor operations on the rows whatever the
// device count. The executor prefers these; the per-device kernels stay for callers holding
// per-device buffers and for ops without a stacked kernel.
using StackedKernel = std::function<std::vector<Stacked>(
    const ir::Node& node, const std::vector<const Stacked*>& inputs)>;
void RegisterStackedKernel(const std::string& qualified_name, StackedKernel kernel);
const StackedKernel* FindStackedKernel(const std::string& qualified_name);

// One kernel per partitioner-inserted spmd op, for each executor (per-device and stacked); the
// list of ops lives here once, so an op added to one executor cannot be missing from the other.
template <typename Kernel>
struct SpmdOpKernels {
  Kernel all_gather, all_reduce, reduce_scatter, all_to_all, collective_permute, shard_slice,
      ring_slice, ring_unroll, mask_pad, halo_exchange;
};
// Calls register_one(op, kernel) for each op of `kernels`.
template <typename Kernel, typename RegisterOne>
void RegisterSpmdOpKernels(const SpmdOpKernels<Kernel>& k, RegisterOne register_one) {
  const ir::InternalOps& ops = ir::InternalOps::Get();
  for (const auto& [op, kernel] : {std::pair{ops.all_gather, k.all_gather},
                                   {ops.all_reduce, k.all_reduce},
                                   {ops.reduce_scatter, k.reduce_scatter},
                                   {ops.all_to_all, k.all_to_all},
                                   {ops.collective_permute, k.collective_permute},
                                   {ops.shard_slice, k.shard_slice},
                                   {ops.ring_slice, k.ring_slice},
                                   {ops.ring_unroll, k.ring_unroll},
                                   {ops.mask_pad, k.mask_pad},
                                   {ops.halo_exchange, k.halo_exchange}})
    register_one(op, kernel);
}

// Registers the collective and device-local spmd kernels (collective_kernels.cc). Called from
// this library's own registrar: the runtime is a static library, so a registrar living only in
// collective_kernels.o could be dropped by the linker.
void RegisterCollectiveKernels();
// Registers the kernels of the xm:: cross-replica collectives (replica_kernels.cc), likewise.
void RegisterReplicaKernels();
// Registers the stacked kernels of the spmd:: ops (stacked_kernels.cc), likewise.
void RegisterStackedKernels();

// Runs one partitioner-inserted spmd op outside a program, on per-device `inputs`, with `args`
// in the op's schema order and its groups over `mesh`: the output type comes from
// ir::SpmdOutputShape, as the partitioner would declare it. For tests and debugging.
// `stacked` runs its stacked kernel instead of the per-device one.
PerDevice RunSpmdOp(const ir::OpInfo& op, std::vector<ir::Arg> args, MeshPtr mesh,
                    const PerDevice& inputs, bool stacked = false);

}  // namespace spmd::runtime
