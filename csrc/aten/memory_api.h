// Where a value lives: the user's marks that keep a value in host memory between the forward
// and the backward (torch_spmd.memory.offload, save_on_cpu; partition/offload.h).
#pragma once
#include <ATen/Tensor.h>

namespace spmd::aten {

// A new lazy tensor with `t`'s value, marked: its readers in the backward read it from host
// memory (`to_host`), or from device memory as usual (a checkpoint name to save). No value
// moves until the step runs.
at::Tensor Offload(const at::Tensor& t, bool to_host);

}  // namespace spmd::aten
