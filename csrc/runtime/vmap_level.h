// One level of functorch's vmap, driven from C++: the executor runs a local op once over the
// stacked shards of all devices (stacked.h) by handing ATen BatchedTensors whose batch dim is
// the row dim. ATen's batching rules (the C++ behind torch.vmap) then run most ops as one
// kernel call over all rows (mm as one mm or bmm, pointwise ops as they are, reductions over the
// shifted dims); ops without a rule fall back to functorch's per-row loop inside ATen.
#pragma once
#include <ATen/Tensor.h>

#include <cstdint>

namespace spmd::runtime {

class VmapLevel {
 public:
  explicit VmapLevel(int64_t batch_size);  // pushes the level
  ~VmapLevel();                            // pops it if Pop() was not called
  VmapLevel(const VmapLevel&) = delete;
  VmapLevel& operator=(const VmapLevel&) = delete;

  // `rows` [batch_size, ...] as one value per row.
  at::Tensor Batched(const at::Tensor& rows) const;
  // Pops the level. Results must be unwrapped after it (Rows).
  void Pop();
  // A result computed under this level as rows [batch_size, ...]; undefined when it does not
  // vary over the rows (it is then `result` itself, the same for every row).
  at::Tensor Rows(const at::Tensor& result) const;

 private:
  int64_t level_;
  int64_t batch_size_;
  bool pushed_ = true;
  bool fallback_warning_;  // functorch's "no batching rule" warning, off while we run
};

}  // namespace spmd::runtime
