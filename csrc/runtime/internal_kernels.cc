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
// partitioner has already moved the data into the constrained layout.
std::vector<PerDevice> Identity(const ir::Node& node, const std::vector<const PerDevice*>& in) {
  return {*in.at(0)};
}
std::vector<Stacked> StackedIdentity(const ir::Node& node, const std::vector<const Stacked*>& in) {
  return {*in.at(0)};
}

struct Registrar {
  Registrar() {
    RegisterInternalKernel(ir::InternalOps::Get().sharding_constraint->qualified, Identity);
    RegisterStackedKernel(ir::InternalOps::Get().sharding_constraint->qualified, StackedIdentity);
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
