// Zero-copy view ops in the executor.
//
// Functionalization hands the backend view ops as copies (view_copy, _reshape_alias_copy,
// t_copy, detach_copy, ...), and running them as copies makes every reshape of a large value
// hold two buffers of its size for a moment: an FSDP layer's gathered parameters were
// flattened, sliced and reshaped through three full-size copies, and a matmul with a weight
// first materialized its transpose. When the input dies at the view (this instruction is its
// last reader and no other holder shares its buffer), the executor instead returns a view of
// the input's host tensor and hands the input's allocation to the result: XLA treats such
// reshapes as bitcasts and folds transposes into the dot, the same effect.
//
// Reinterpreting views (reshape-like) need an input whose strides allow the view: a
// contiguous one, or rows split from a merged call as that call laid them out
// (row_merge.h), whose reshapes that keep the merged dims apart are views too.
// Permuting views (t, transpose, permute) give a strided result, allowed only where every
// reader is an ATen kernel that accepts any strides (not a stride-reinterpreting op, not an
// internal spmd kernel) and the value does not leave the program. Subset views (select) are
// strided too, and see only part of their input's bytes: they never take those bytes over.
//
// A view that outlives its input's last reader, or cannot take its bytes over, borrows
// them: it reads the input's host memory and charges its own bytes to each device, as the
// copy it stands for would. Values are immutable (a kernel writing an input writes a clone),
// so sharing host memory is never observable.
#pragma once
#include <ATen/Tensor.h>

#include "ir/node.h"

namespace spmd::runtime {

enum class ViewAlias { kNone, kReinterpret, kPermute, kSubset };

// How `node` (an ATen view-as-copy op with one tensor input and one output) can alias its
// input, judging from the op and its static shapes.
ViewAlias ViewAliasOf(const ir::Node& node);

// Ops that read their input's memory layout (explicit strides, or view semantics on a
// possibly non-viewable layout): their tensor inputs must be contiguous.
bool IsStrideSensitive(const ir::OpInfo* op);

// The view `node` computes on `input` (which must satisfy ViewAliasOf's requirements:
// contiguous for kReinterpret), or on each row of `input` when its first `batch_dims` dims
// stack devices' shards (stacked.h).
at::Tensor AliasedView(const ir::Node& node, ViewAlias kind, const at::Tensor& input,
                       int64_t batch_dims = 0);

}  // namespace spmd::runtime
