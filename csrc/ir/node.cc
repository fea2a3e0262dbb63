#include "ir/node.h"

namespace spmd::ir {

namespace {
std::atomic<uint64_t> g_next_node_id{0};
}

const TensorType& Value::type() const { return node->output(index); }

Node::Node(const OpInfo* op, std::vector<Value> inputs, std::vector<Arg> args,
           std::vector<TensorType> outputs)
    : op_(op),
      inputs_(std::move(inputs)),
      own_{std::move(args), std::move(outputs), {}},
      attrs_(&own_),
      id_(g_next_node_id.fetch_add(1, std::memory_order_relaxed)),
      scope_(CurrentScope()),
      in_backward_(InBackward()) {}

Node::Node(const OpInfo* op, std::vector<Value> inputs, std::shared_ptr<const Attrs> shared)
    : op_(op),
      inputs_(std::move(inputs)),
      shared_(std::move(shared)),
      attrs_(shared_.get()),
      id_(g_next_node_id.fetch_add(1, std::memory_order_relaxed)),
      scope_(CurrentScope()),
      in_backward_(InBackward()) {}

void Node::set_shardings(std::vector<Sharding> s) {
  if (shared_) {  // (copy on write)
    own_ = *shared_;
    shared_.reset();
    attrs_ = &own_;
  }
  own_.shardings = std::move(s);
  hash_ = 0;
}

Hash Node::hash() const {
  if (hash_ != 0) return hash_;
  Hash h = HashString(op_->qualified);
  for (const Arg& a : attrs_->args) h = HashCombine(h, a.hash());
  for (const TensorType& t : attrs_->outputs) {
    h = HashCombine(h, HashInt(static_cast<int64_t>(t.dtype)));
    h = HashCombine(h, HashInts(t.shape));
  }
  for (const Sharding& s : attrs_->shardings) h = HashCombine(h, s.valid() ? s.hash() : 1);
  if (data_) {
    const Sharding& s = data_->sharding();
    h = HashCombine(h, s.valid() ? s.hash() : 2);
  }
  if (in_backward_) h = HashCombine(h, 3);
  hash_ = h == 0 ? 1 : h;
  return hash_;
}

bool Node::draws_random_numbers() const {
  if (attrs_->args.size() > op_->args.size()) return true;
  for (const ArgSchema& a : op_->args)
    if (a.type == ArgType::kGenerator) return true;
  return false;
}

NodePtr MakeNode(const OpInfo* op, std::vector<Value> inputs, std::vector<Arg> args,
                 std::vector<TensorType> outputs) {
  return std::make_shared<Node>(op, std::move(inputs), std::move(args), std::move(outputs));
}

NodePtr MakeNode(const OpInfo* op, std::vector<Value> inputs,
                 std::shared_ptr<const Node::Attrs> shared) {
  return std::make_shared<Node>(op, std::move(inputs), std::move(shared));
}

uint64_t NextNodeId() { return g_next_node_id.load(std::memory_order_relaxed); }

}  // namespace spmd::ir

#include "ir/internal_ops.h"

namespace spmd::ir {
NodePtr MakeDataNode(std::shared_ptr<DataHandle> data) {
  TensorType type = data->type();
  auto node = MakeNode(InternalOps::Get().device_data, {}, {}, {type});
  node->set_data(std::move(data));
  return node;
}
}  // namespace spmd::ir
