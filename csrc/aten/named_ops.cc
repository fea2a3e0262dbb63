#include "aten/named_ops.h"

#include <algorithm>
#include <unordered_map>

#include "aten/eager_fallback.h"
#include "aten/recorder.h"
#include "aten/shape_functions.h"
#include "aten/transfers.h"

namespace spmd::aten {

namespace {

using Table = std::unordered_map<std::string, NamedOp>;

const Table& NamedOps() {
  static const auto* table = new Table{
      // Moves between the host and the devices (transfers.h).
      {"aten::_to_copy", {.special = ToCopy, .not_a_view_copy = true}},
      {"aten::copy_", {.special = CopyInPlace, .may_write_host = true}},
      {"aten::copy", {.special = CopyFunctional}},
      {"aten::_copy_from", {.special = CopyFrom, .not_a_view_copy = true}},
      {"aten::_copy_from_and_resize", {.special = CopyFrom}},
      {"aten::_local_scalar_dense", {.special = LocalScalarDense}},
      // (resize_ changes its self's metadata legitimately: no functionalization fix.)
      {"aten::resize_", {.special = Resize, .functionalize = FunctionalizeFix::kNone}},
      {"aten::detach_copy", {.special = SameValue}},
      {"aten::alias_copy", {.special = SameValue}},
      {"aten::lift_fresh_copy", {.special = SameValue}},
      {"aten::lift_fresh", {.special = SameValue}},  // (torch.tensor(data, device=...), torch >= 2.13)
      {"aten::clone", {.special = CloneKeepingAnnotation}},
      // Non-tensor results that depend only on their arguments' sizes and dtypes, never on
      // values: answered from metadata, since running them eagerly would sync their inputs.
      {"aten::is_same_size", {.special = AnswerFromMetadata}},
      {"aten::_has_same_storage_numel", {.special = AnswerFromMetadata}},
      {"aten::is_pinned", {.special = AnswerFromMetadata}},
      // Strides describing the input's virtual (strided-device) layout, which must not reach a
      // kernel: recorded without them (recorder.h).
      {"aten::_reshape_alias", {.special = RecordReshapeAliasAsView, .recorded_as = "aten::view"}},
      {"aten::_reshape_alias_copy",
       {.special = RecordReshapeAliasAsView, .recorded_as = "aten::view_copy"}},
      // Meta kernels that disagree with the CPU kernel (shape_functions.h).
      // native_batch_norm's CPU kernel also writes running_mean and running_var, arguments 3
      // and 4 (input, weight, bias, running_mean, running_var, training, momentum, eps).
      {"aten::native_batch_norm", {.shape = BatchNorm, .hidden_writes = {3, 4}}},
      {"aten::_native_batch_norm_legit", {.shape = BatchNorm}},
      {"aten::_native_batch_norm_legit.no_stats", {.shape = BatchNorm}},
      {"aten::_native_batch_norm_legit_functional", {.shape = BatchNorm}},
      {"aten::_batch_norm_with_update", {.shape = BatchNorm}},
      {"aten::_batch_norm_with_update_functional", {.shape = BatchNorm}},
      {"aten::_embedding_bag", {.shape = EmbeddingBag}},
      {"aten::_embedding_bag_forward_only", {.shape = EmbeddingBag}},
      {"aten::native_layer_norm", {.shape = NativeLayerNorm}},
      {"aten::_scaled_dot_product_flash_attention_for_cpu", {.shape = FlashAttentionForCpu}},
      {"aten::_scaled_mm", {.shape = ScaledMm}},
      {"aten::_grouped_mm", {.shape = GroupedMm}},
      // Functionalization (backend.cc). detach: its composite kernel (a shallow copy sharing
      // its slot) is kept, and functionalization's detach copies or aliases.
      {"aten::detach", {.keeps_composite_kernel = true, .functionalize = FunctionalizeFix::kDetach}},
      // In-place ops that change only metadata, which functionalization handles (views), or
      // that legitimately change their self's metadata.
      {"aten::t_", {.functionalize = FunctionalizeFix::kNone}},
      {"aten::transpose_", {.functionalize = FunctionalizeFix::kNone}},
      {"aten::squeeze_", {.functionalize = FunctionalizeFix::kNone}},
      {"aten::unsqueeze_", {.functionalize = FunctionalizeFix::kNone}},
      {"aten::swapaxes_", {.functionalize = FunctionalizeFix::kNone}},
      {"aten::swapdims_", {.functionalize = FunctionalizeFix::kNone}},
      {"aten::resize_as_", {.functionalize = FunctionalizeFix::kNone}},
      {"aten::set_", {.functionalize = FunctionalizeFix::kNone}},
      {"aten::as_strided_", {.functionalize = FunctionalizeFix::kNone}},
      {"aten::_resize_output_", {.functionalize = FunctionalizeFix::kNone}},
  };
  return *table;
}

}  // namespace

const NamedOp* FindNamedOp(const std::string& name) {
  auto it = NamedOps().find(name);
  return it == NamedOps().end() ? nullptr : &it->second;
}

std::vector<std::string> NamedOpNames() {
  std::vector<std::string> names;
  for (const auto& [name, op] : NamedOps()) {
    names.push_back(name);
    if (op.recorded_as) names.push_back(op.recorded_as);
  }
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  return names;
}

}  // namespace spmd::aten
