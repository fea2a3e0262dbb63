// Kernels for the spmd:: ops (collectives, device-dependent slicing and masking). Each kernel
// sees one value per device for every input and produces one per device for every output, so
// it can move data between devices. Registered by op name; the executor looks them up once.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "ir/node.h"
#include "runtime/device_data.h"

namespace spmd::runtime {

using PerDevice = std::vector<BufferPtr>;  // one buffer per device

using InternalKernel = std::function<std::vector<PerDevice>(
    const ir::Node& node, const std::vector<const PerDevice*>& inputs)>;

void RegisterInternalKernel(const std::string& qualified_name, InternalKernel kernel);
const InternalKernel* FindInternalKernel(const std::string& qualified_name);

// Per-device buffers for `tensors` (one per device), sharing a buffer object between devices
// that got the very same host tensor.
PerDevice MakePerDevice(const std::vector<at::Tensor>& tensors, const std::string& label);

}  // namespace spmd::runtime
