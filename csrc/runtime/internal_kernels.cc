#include "runtime/internal_kernels.h"

#include <mutex>
#include <unordered_map>

#include "core/error.h"
#include "ir/internal_ops.h"

namespace spmd::runtime {

namespace {
std::unordered_map<std::string, InternalKernel>& Registry() {
  static auto* r = new std::unordered_map<std::string, InternalKernel>();
  return *r;
}
std::unordered_map<std::string, StackedKernel>& StackedRegistry() {
  static auto* r = new std::unordered_map<std::string, StackedKernel>();
  return *r;
}
std::mutex& RegistryMutex() {
  static auto* mu = new std::mutex();
  return *mu;
}

// A sharding constraint is an identity on each device: by the time a program runs, the
// partitioner has already moved the data into the constrained layout. So are the moves to and
// from host memory, whose result is charged to the host.
std::vector<PerDevice> Identity(const ir::Node& node, const std::vector<const PerDevice*>& in) {
  return {*in.at(0)};
}
std::vector<Stacked> StackedIdentity(const ir::Node& node, const std::vector<const Stacked*>& in) {
  return {*in.at(0)};
}

struct Registrar {
  Registrar() {
    // The copies between a device's memory and its host's hold the same values: the executor
    // charges a place_to_host result to the host (Instruction::on_host).
    const ir::InternalOps& ops = ir::InternalOps::Get();
    for (const ir::OpInfo* op : {ops.sharding_constraint, ops.place_to_host, ops.place_to_device}) {
      RegisterInternalKernel(op->qualified, Identity);
      RegisterStackedKernel(op->qualified, StackedIdentity);
    }
    RegisterCollectiveKernels();
    RegisterReplicaKernels();
    RegisterStackedKernels();
  }
} registrar;
}  // namespace

void RegisterInternalKernel(const std::string& qualified_name, InternalKernel kernel) {
  std::lock_guard<std::mutex> lock(RegistryMutex());
  Registry()[qualified_name] = std::move(kernel);
}

const InternalKernel* FindInternalKernel(const std::string& qualified_name) {
  std::lock_guard<std::mutex> lock(RegistryMutex());
  auto it = Registry().find(qualified_name);
  return it == Registry().end() ? nullptr : &it->second;
}

void RegisterStackedKernel(const std::string& qualified_name, StackedKernel kernel) {
  std::lock_guard<std::mutex> lock(RegistryMutex());
  StackedRegistry()[qualified_name] = std::move(kernel);
}

const StackedKernel* FindStackedKernel(const std::string& qualified_name) {
  std::lock_guard<std::mutex> lock(RegistryMutex());
  auto it = StackedRegistry().find(qualified_name);
  return it == StackedRegistry().end() ? nullptr : &it->second;
}

}  // namespace spmd::runtime
