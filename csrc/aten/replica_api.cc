#include "aten/replica_api.h"

#include <ATen/FunctionalTensorWrapper.h>

#include "aten/lazy_tensor.h"
#include "aten/recorder.h"
#include "core/metrics.h"
#include "ir/replica_ops.h"

namespace spmd::aten {

namespace {

const ir::ReplicaOps& Ops() { return ir::ReplicaOps::Get(); }

const ir::Value& ValueOf(const at::Tensor& t, const char* what) {
  return GetLazyImpl(t, what)->slot()->value;
}

// Records `op` on one input with `attrs` (schema order, after the tensor) and wraps its result.
at::Tensor RecordSingle(const ir::OpInfo* op, const at::Tensor& t, std::vector<ir::Arg> attrs,
                        const ReplicaGroups& groups) {
  std::lock_guard<GraphLock> lock(GraphMutex());
  const ir::Value& in = ValueOf(t, op->qualified.c_str());
  std::vector<ir::Arg> args{ir::Arg::Tensor(0)};
  args.insert(args.end(), attrs.begin(), attrs.end());
  for (ir::Arg& a : ir::GroupArgs(groups)) args.push_back(std::move(a));
  const ir::ReplicaAttrs parsed = ir::ReplicaAttrs::Read(*op, args);
  TensorType out{in.type().dtype, ir::ReplicaOutputShape(*op, in.type().shape, parsed)};
  ir::Value v = RecordNode(op, {in}, std::move(args), std::move(out));
  return WrapOutput(v, /*factory=*/true);
}

}  // namespace

std::vector<at::Tensor> ReplicaAllReduce(const std::vector<at::Tensor>& inputs, ReduceOp op,
                                         double scale, const ReplicaGroups& groups) {
  if (inputs.empty()) return {};
  std::lock_guard<GraphLock> lock(GraphMutex());
  std::vector<ir::Value> values;
  std::vector<int64_t> indices;
  std::vector<TensorType> types;
  for (const at::Tensor& t : inputs) {
    indices.push_back(static_cast<int64_t>(values.size()));
    values.push_back(ValueOf(t, "xm.all_reduce"));
    types.push_back(values.back().type());
  }
  std::vector<ir::Arg> args{ir::Arg::TensorList(std::move(indices)),
                            ir::Arg::Int(static_cast<int64_t>(op)), ir::Arg::Double(scale)};
  for (ir::Arg& a : ir::GroupArgs(groups)) args.push_back(std::move(a));
  ir::NodePtr node =
      ir::MakeNode(Ops().all_reduce, std::move(values), std::move(args), std::move(types));
  std::vector<at::Tensor> out;
  for (int o = 0; o < node->num_outputs(); ++o)
    out.push_back(WrapOutput(ir::Value{node, o}, /*factory=*/true));
  return out;
}

at::Tensor ReplicaAllGather(const at::Tensor& t, int64_t dim, const ReplicaGroups& groups) {
  return RecordSingle(Ops().all_gather, t, {ir::Arg::Int(WrapDim(dim, t.dim()))}, groups);
}

at::Tensor ReplicaReduceScatter(const at::Tensor& t, ReduceOp op, double scale, int64_t dim,
                                const ReplicaGroups& groups) {
  return RecordSingle(Ops().reduce_scatter, t,
                      {ir::Arg::Int(static_cast<int64_t>(op)), ir::Arg::Double(scale),
                       ir::Arg::Int(WrapDim(dim, t.dim()))},
                      groups);
}

at::Tensor ReplicaAllToAll(const at::Tensor& t, int64_t split_dim, int64_t concat_dim,
                           const ReplicaGroups& groups) {
  return RecordSingle(Ops().all_to_all, t,
                      {ir::Arg::Int(WrapDim(split_dim, t.dim())),
                       ir::Arg::Int(WrapDim(concat_dim, t.dim()))},
                      groups);
}

void AssignValue(const at::Tensor& dst, const at::Tensor& src) {
  namespace fn = at::functionalization::impl;
  std::lock_guard<GraphLock> lock(GraphMutex());
  const ir::Value& value = ValueOf(src, "the value to assign");
  const TensorType& have = ValueOf(dst, "the tensor to update in place").type();
  TORCH_CHECK(have == value.type(), "cannot update a ", have.ToString(), " tensor in place with a ",
              value.type().ToString(), " result");
  if (fn::isFunctionalTensor(dst)) {
    // What functionalization does for an in-place op: swap in the new value, then record the
    // update on the shared storage so views and aliases regenerate from it.
    fn::replace_(dst, MakeLazyTensor(value));
    fn::commit_update(dst);
    fn::sync(dst);
  } else {
    SetSlotValue(GetLazyImpl(dst)->slot(), value);
  }
  dst.unsafeGetTensorImpl()->bump_version();
}

}  // namespace spmd::aten
