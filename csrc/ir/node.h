// The lazy graph: immutable SSA nodes shared by pointer. A node is an op, its tensor inputs
// (other nodes' outputs), its non-tensor args in schema order, and the static types of its
// outputs. Parameter nodes (spmd::device_data) carry a handle to data already on the devices.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "core/hash.h"
#include "core/shape.h"
#include "ir/arg.h"
#include "ir/op.h"
#include "ir/scope.h"
#include "sharding/sharding.h"

namespace spmd::ir {

class Node;
using NodePtr = std::shared_ptr<Node>;

// One output of one node.
struct Value {
  NodePtr node;
  int index = 0;

  bool valid() const { return node != nullptr; }
  const TensorType& type() const;
  bool operator==(const Value& o) const { return node == o.node && index == o.index; }
};

// Hashes a Value by identity (its node and output), for maps keyed by values.
struct ValueHash {
  size_t operator()(const Value& v) const {
    return std::hash<const void*>()(v.node.get()) * 31 + static_cast<size_t>(v.index);
  }
};

// Data that already lives on the devices (a materialized tensor). The runtime implements it;
// the IR only needs its type and layout.
class DataHandle {
 public:
  virtual ~DataHandle() = default;
  virtual const TensorType& type() const = 0;
  virtual const Sharding& sharding() const = 0;  // invalid() = not laid out yet (replicated)
};

class Node {
 public:
  // What a node is besides its inputs: its args, output types and shardings. Nodes made from
  // one template (aten/graph_template.h: a compiled region replayed at every call) share one
  // immutable copy instead of copying it into each.
  struct Attrs {
    std::vector<Arg> args;
    std::vector<TensorType> outputs;
    std::vector<Sharding> shardings;
  };

  Node(const OpInfo* op, std::vector<Value> inputs, std::vector<Arg> args,
       std::vector<TensorType> outputs);
  Node(const OpInfo* op, std::vector<Value> inputs, std::shared_ptr<const Attrs> shared);
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  const OpInfo* op() const { return op_; }
  const std::vector<Value>& inputs() const { return inputs_; }
  const Value& input(size_t i) const { return inputs_.at(i); }
  const std::vector<Arg>& args() const { return attrs_->args; }
  const Arg& arg(size_t i) const { return attrs_->args.at(i); }
  const std::vector<TensorType>& outputs() const { return attrs_->outputs; }
  const TensorType& output(size_t i) const { return attrs_->outputs.at(i); }
  int num_outputs() const { return static_cast<int>(attrs_->outputs.size()); }
  uint64_t id() const { return id_; }

  // Parameter nodes.
  const std::shared_ptr<DataHandle>& data() const { return data_; }
  void set_data(std::shared_ptr<DataHandle> d) { data_ = std::move(d); }
  bool is_data() const { return data_ != nullptr; }

  // Optional per-output sharding: the user's constraint on spmd::sharding_constraint nodes, and
  // the chosen layout on nodes of a partitioned program. Part of the node's hash.
  const std::vector<Sharding>& shardings() const { return attrs_->shardings; }
  void set_shardings(std::vector<Sharding> s);

  // The module path the op was recorded under (ir/scope.h); not part of the hash.
  Scope scope() const { return scope_; }
  void set_scope(Scope s) { scope_ = s; }

  // Recorded by a backward pass (ir/scope.h InBackward); part of the hash, since the
  // partitioner does not keep gathered copies from the forward for the backward.
  bool in_backward() const { return in_backward_; }
  void set_in_backward(bool b) { in_backward_ = b; hash_ = 0; }

  // Hash of op, args, output types and phase (not of the inputs: graphs hash their wiring).
  Hash hash() const;

  // Whether the op draws random numbers: it takes a Generator, or the recorder appended a
  // seed after its schema's arguments (a random op without one; aten/recorder.cc SeedArg).
  bool draws_random_numbers() const;

 private:
  const OpInfo* op_;
  std::vector<Value> inputs_;
  Attrs own_;                             // a node's own attrs, unless it shares a template's:
  std::shared_ptr<const Attrs> shared_;  // then own_ stays empty
  const Attrs* attrs_;                    // &own_ or shared_.get()
  std::shared_ptr<DataHandle> data_;
  uint64_t id_;
  Scope scope_ = nullptr;
  bool in_backward_ = false;
  mutable Hash hash_ = 0;
};

NodePtr MakeNode(const OpInfo* op, std::vector<Value> inputs, std::vector<Arg> args,
                 std::vector<TensorType> outputs);
NodePtr MakeNode(const OpInfo* op, std::vector<Value> inputs,
                 std::shared_ptr<const Node::Attrs> shared);

// The id the next node will get: every node made later has an id at least this (ids only grow).
uint64_t NextNodeId();

}  // namespace spmd::ir

namespace spmd::ir {
// A parameter node for data already on the devices.
NodePtr MakeDataNode(std::shared_ptr<DataHandle> data);
}  // namespace spmd::ir
