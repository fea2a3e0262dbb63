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
// Which ops are views, and of which kind, their sharding rules say (ViewKind, carried to the
// executor in the program's OpTraits); nothing here knows an op by name.
// Reshapes (ViewKind::kReshape) need an input whose strides allow the view: a
// contiguous one, or rows split from a merged call as that call laid them out
// (row_merge.h), whose reshapes that keep the merged dims apart are views too.
// Permutations (t, transpose, permute) give a strided result, allowed only where every
// reader is an ATen kernel that accepts any strides (not one whose rule says it reads
// strides, not an internal spmd kernel) and the value does not leave the program. Subsets
// (select, slice) are strided too, and see only part of their input's bytes: they never take
// those bytes over. Both run the op's own view kernel (select for select_copy) on the input's
// rows.
//
// A view that outlives its input's last reader, or cannot take its bytes over, borrows
// them: it reads the input's host memory and charges its own bytes to each device, as the
// copy it stands for would. Values are immutable (a kernel writing an input writes a clone),
// so sharing host memory is never observable.
#pragma once
#include <ATen/Tensor.h>

#include "ir/node.h"
#include "partition/op_traits.h"

namespace spmd::runtime {

using partition::ViewKind;

// How `node` (an ATen op with one tensor input and one output, whose rule declares the view
// kind in `traits`) can alias its input, judging from that kind and the node's static types:
// kReshape when the result holds exactly the input's elements in row-major order, kPermute,
// kSubset (a subset that keeps every element is a reshape); kNone otherwise.
ViewKind ViewAliasOf(const ir::Node& node, const partition::OpTraits& traits);

// A kReshape view of `input` as `node`'s result shape, or of each row of `input` when its first
// `batch_dims` dims stack devices' shards (stacked.h). The input's strides must allow it
// (at::detail::computeStride). Permuting and subset views run the op's own view kernel
// (Executable::TryAliasInput).
at::Tensor ReshapedView(const ir::Node& node, const at::Tensor& input, int64_t batch_dims = 0);

}  // namespace spmd::runtime
