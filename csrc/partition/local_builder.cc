#include "partition/local_builder.h"

#include "core/error.h"

namespace spmd::partition {

ir::NodePtr ProgramBuilder::Emit(const ir::OpInfo* op, std::vector<ir::Value> inputs,
                                 std::vector<ir::Arg> args, std::vector<TensorType> outputs,
                                 std::vector<Sharding> layouts) {
  ir::NodePtr node = ir::MakeNode(op, std::move(inputs), std::move(args), std::move(outputs));
  node->set_shardings(std::move(layouts));
  node->set_scope(scope_);
  nodes_.push_back(node);
  return node;
}

ir::Value ProgramBuilder::EmitInternal(const ir::OpInfo* op, const ir::Value& x,
                                       std::vector<ir::Arg> attrs, const TensorType& out,
                                       const Sharding& layout, const char* kind,
                                       const AxisList& axes) {
  std::vector<ir::Arg> args;
  args.push_back(ir::Arg::Tensor(0));
  for (auto& a : attrs) args.push_back(std::move(a));
  ir::NodePtr node = Emit(op, {x}, std::move(args), {out}, {layout});
  if (kind) RecordCollective(kind, axes, x.type().bytes(), node.get());
  return ir::Value{node, 0};
}

void ProgramBuilder::RecordCollective(const char* kind, const AxisList& axes, int64_t bytes,
                                      const ir::Node* node) {
  SPMD_CHECK(!nodes_.empty() && nodes_.back().get() == node,
             "internal error: a collective is recorded right after its node is emitted");
  CollectiveStat stat;
  stat.kind = kind;
  for (int a : axes) stat.axes.push_back(mesh_->AxisLabel(a));
  stat.group_size = AxesSize(*mesh_, axes);
  stat.bytes = bytes;
  stat.first_group = FirstDeviceGroup(*mesh_, axes);
  stat.mesh_devices = mesh_->size();
  if (!mesh_shape_ || *mesh_shape_ != mesh_->shape())
    mesh_shape_ = std::make_shared<const std::vector<int64_t>>(mesh_->shape());
  stat.mesh_shape = mesh_shape_;
  stat.node = node;
  stat.scope = ir::ScopeName(scope_);
  stat.position = static_cast<int64_t>(nodes_.size()) - 1;
  collectives_.push_back(std::move(stat));
}

namespace {
// Tiles of the whole tensor (product over dims): fewer means a bigger piece per device.
int64_t TotalTiles(const Sharding& s) {
  int64_t tiles = 1;
  for (int64_t d = 0; d < s.rank(); ++d) tiles *= s.NumTiles(d);
  return tiles;
}

Hash ReshardKey(const ir::Value& v, const Sharding& from, const Sharding& to) {
  Hash h = HashCombine(std::hash<const void*>()(v.node.get()), HashInt(v.index));
  return HashCombine(HashCombine(h, from.hash()), to.hash());
}
}  // namespace

const LocalValue* ProgramBuilder::FindReshard(const ir::Value& v, const Sharding& from,
                                              const Sharding& to) const {
  auto range = reshards_.equal_range(ReshardKey(v, from, to));
  const bool gathers = !from.IsPartial() && TotalTiles(to) < TotalTiles(from);
  for (auto it = range.first; it != range.second; ++it) {
    const ReshardEntry& e = it->second;
    if (e.value.node != v.node || e.value.index != v.index || e.from != from || e.to != to)
      continue;
    if (gathers && e.in_backward != in_backward_) continue;  // see the header
    return &e.result;
  }
  return nullptr;
}

void ProgramBuilder::AddReshard(const ir::Value& v, const Sharding& from, const Sharding& to,
                                const LocalValue& result) {
  reshards_.emplace(ReshardKey(v, from, to), ReshardEntry{v, from, to, result, in_backward_});
  if (from.IsPartial() && !to.IsPartial()) resolved_.emplace(std::make_pair(v.node.get(), v.index), result);
}

const LocalValue* ProgramBuilder::FindResolved(const ir::Value& v) const {
  auto it = resolved_.find({v.node.get(), v.index});
  return it == resolved_.end() ? nullptr : &it->second;
}

std::vector<ir::Arg> WithScalarSlots(std::vector<ir::Arg> args, int32_t first_slot) {
  int32_t slot = first_slot;
  for (ir::Arg& a : args) {
    if (a.dynamic) a.slot = slot;
    slot += a.num_slots();
  }
  return args;
}

std::vector<LocalValue> LocalBuilder::EmitNodeOp(const std::vector<LocalValue>& operands,
                                                 std::vector<ir::Arg> args) {
  std::vector<ir::Value> inputs;
  for (const LocalValue& v : operands) inputs.push_back(v.value);
  std::vector<TensorType> outs;
  for (int o = 0; o < node_.num_outputs(); ++o) {
    const TensorType& g = node_.output(o);
    outs.push_back(g.dtype == DType::kUndefined
                       ? g
                       : TensorType{g.dtype, LocalShape(g.shape, result_layouts_.at(o))});
  }
  ir::NodePtr n = program_.Emit(node_.op(), std::move(inputs), std::move(args), outs,
                                result_layouts_);
  std::vector<LocalValue> results;
  for (int o = 0; o < node_.num_outputs(); ++o)
    results.push_back(LocalValue{ir::Value{n, o}, result_layouts_[o], node_.output(o)});
  return results;
}

LocalValue LocalBuilder::EmitOp(const char* qualified, const std::vector<ir::ArgSchema>& schema,
                                std::vector<ir::Value> inputs, std::vector<ir::Arg> args,
                                const TensorType& local_out, const Sharding& layout,
                                const TensorType& global) {
  const ir::OpInfo* op = ir::InternOp(qualified, schema, 1);
  // The executor builds the kernel's stack from these args: all of the op's arguments, in
  // schema order (the op may have been interned from its real schema by the recorder).
  SPMD_CHECK(args.size() == op->args.size(), "internal error: ", qualified, " takes ",
             op->args.size(), " arguments, the lowering gave ", args.size());
  ir::NodePtr n = program_.Emit(op, std::move(inputs), std::move(args), {local_out}, {layout});
  return LocalValue{ir::Value{n, 0}, layout, global};
}

LocalValue LocalBuilder::Scale(const LocalValue& v, double factor) {
  if (factor == 1.0) return v;
  return EmitOp("aten::mul.Scalar", {{"self", ir::ArgType::kTensor}, {"other", ir::ArgType::kScalar}},
                {v.value}, {ir::Arg::Tensor(0), ir::Arg::ScalarDouble(factor)}, v.value.type(),
                v.layout, v.global);
}

}  // namespace spmd::partition
