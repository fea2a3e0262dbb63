// View ops without copies (view_aliasing.h): a view shares, takes over or borrows its input's
// bytes.
#include "runtime/executable.h"

#include <ATen/ATen.h>

#include "core/metrics.h"
#include "runtime/kernel_call.h"

namespace spmd::runtime {

bool Executable::TryAliasInput(const Instruction& ins, std::vector<SlotValue>& slots,
                               const std::vector<ir::ScalarValue>& scalars) const {
  int in = ins.inputs[0];
  SlotValue& input = slots[in];
  const Stacked& s = StackIn(input);
  SlotValue out;
  if (ins.alias == ViewKind::kReshape) {
    // A reshape views each row: a contiguous row always, a strided one (a value whose rows
    // were split from a merged call, laid out as that call wrote them) when its strides
    // allow it.
    if (!s.Row(0).is_contiguous()) {
      std::vector<int64_t> shape{s.rows.size(0)};
      const Shape& result = ins.node->output(0).shape;
      shape.insert(shape.end(), result.begin(), result.end());
      if (!at::detail::computeStride(s.rows.sizes(), s.rows.strides(), shape)) return false;
    }
    out.stack = Stacked{ReshapedView(*ins.node, s.rows, /*batch_dims=*/1), s.map};
  } else {
    at::Tensor rows = ViewOfRows(ins, s, scalars);
    if (!rows.defined()) return false;
    out.stack = Stacked{std::move(rows), s.map};
  }
  out.stack.summed = s.summed;
  const bool dies = std::find(ins.free_after.begin(), ins.free_after.end(), in) != ins.free_after.end();
  if (!dies && ins.share_input) {  // the input's bytes hold it: nothing to charge
    out.buffers = UnchargedBuffersOf(out.stack);
    Count("SharedViews");
  } else if (dies && ins.alias != ViewKind::kSubset && CanTakeOver(input)) {
    // The input dies here: the view takes over its bytes.
    out.buffers = BuffersOf(out.stack, ins.labels[0], &input.buffers, /*views=*/false);
    Count("AliasedViews");
  } else {
    // Borrowed: the input's host memory, charged as the copy it stands for (view_aliasing.h).
    out.buffers = BuffersOf(out.stack, ins.labels[0], nullptr, /*views=*/false);
    Count("BorrowedViews");
  }
  slots[ins.outputs[0]] = std::move(out);
  return true;
}

// The op's view kernel (transpose for transpose_copy, ...) on every row of `s` at once: the
// kernel on row 0 says where its view lies in that row (sizes, strides, offset), and every row
// is laid out alike, one row stride apart. Undefined when the kernel made no view of its input.
at::Tensor Executable::ViewOfRows(const Instruction& ins, const Stacked& s,
                                  const std::vector<ir::ScalarValue>& scalars) const {
  const at::Tensor row = s.rows.select(0, 0);
  std::vector<at::Tensor> outs = CallKernel(ins, {row}, scalars, 0, /*as_view=*/true);
  const at::Tensor& view = outs.at(0);
  if (!view.defined() || !view.is_alias_of(row)) return {};
  std::vector<int64_t> sizes{s.rows.size(0)}, strides{s.rows.stride(0)};
  sizes.insert(sizes.end(), view.sizes().begin(), view.sizes().end());
  strides.insert(strides.end(), view.strides().begin(), view.strides().end());
  return s.rows.as_strided(sizes, strides, view.storage_offset());
}

bool Executable::CanTakeOver(const SlotValue& input) {
  for (const BufferPtr& b : input.buffers) {
    // (An uncharged input, itself a shared view, has no bytes to hand over.)
    if (!b || !b->alloc.active()) return false;
    // Nobody outside this slot may hold the buffer (a live tensor, another slot). Devices of a
    // value share one allocation block, so count this slot's own references to it.
    long own = 0;
    for (const BufferPtr& other : input.buffers)
      own += !b.owner_before(other) && !other.owner_before(b);
    if (b.use_count() != own) return false;
  }
  return true;
}

}  // namespace spmd::runtime
