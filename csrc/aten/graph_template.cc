#include "aten/graph_template.h"

#include <ATen/FunctionalTensorWrapper.h>
#include <ATen/core/Generator.h>
#include <ATen/CPUGeneratorImpl.h>

#include <atomic>
#include <unordered_map>

#include "aten/arg_converter.h"
#include "aten/recorder.h"
#include "aten/sharding_api.h"
#include "core/error.h"
#include "core/metrics.h"

namespace spmd::aten {

namespace {

std::atomic<uint64_t> g_host_work{0};
thread_local int t_open_captures = 0;

using ir::ValueHash;

// A random node's seeds, drawn anew: its Generator arguments and the seed the recorder appended
// after the schema's arguments (arg_converter.cc DrawSeed).
void DrawFreshSeeds(const ir::OpInfo& op, std::vector<ir::Arg>& args) {
  for (size_t i = 0; i < args.size(); ++i) {
    const bool seed = i >= op.args.size() || op.args[i].type == ir::ArgType::kGenerator;
    if (seed) args[i] = DrawSeed(at::detail::getDefaultCPUGenerator());
  }
}

}  // namespace

bool CapturingTemplate() { return t_open_captures > 0; }

void NoteHostWork() { g_host_work.fetch_add(1, std::memory_order_relaxed); }

TemplateCapture::TemplateCapture(std::vector<at::Tensor> inputs)
    : inputs_(std::move(inputs)),
      first_node_id_(ir::NextNodeId()),
      host_work_before_(g_host_work.load(std::memory_order_relaxed)) {
  std::lock_guard<GraphLock> lock(GraphMutex());
  for (const at::Tensor& t : inputs_) {
    const SlotPtr& slot = GetLazyImpl(t, "a replayed input")->slot();
    before_.push_back(slot->value);
    annotations_before_.push_back(slot->annotation);
  }
  ++t_open_captures;
}

TemplateCapture::~TemplateCapture() {
  if (!finished_) --t_open_captures;
}

namespace {

// How a template node refers to a value: an input, an earlier template node's output, or a
// constant (a value from before the region that no input carries).
GraphTemplate::Ref RefOf(const ir::Value& v,
                         const std::unordered_map<ir::Value, int, ValueHash>& input_of,
                         const std::unordered_map<const ir::Node*, int>& spec_of) {
  GraphTemplate::Ref r;
  if (auto it = input_of.find(v); it != input_of.end()) {
    r.kind = GraphTemplate::Ref::Kind::kInput;
    r.index = it->second;
  } else if (int spec = spec_of.at(v.node.get()); spec >= 0) {
    r.kind = GraphTemplate::Ref::Kind::kNode;
    r.index = spec;
    r.output = v.index;
  } else {
    r.constant = v;
  }
  return r;
}

}  // namespace

void TemplateCapture::CaptureInputs(GraphTemplate& tmpl, InputOf& input_of,
                                    std::vector<std::pair<int, ir::Value>>& written) const {
  for (size_t i = 0; i < inputs_.size(); ++i) {
    const SlotPtr& slot = GetLazyImpl(inputs_[i], "a replayed input")->slot();
    const ir::Value& now = slot->value;
    tmpl.input_types_.push_back(before_[i].type());
    auto [it, fresh] = input_of.emplace(before_[i], static_cast<int>(i));
    tmpl.input_same_as_.push_back(fresh ? -1 : it->second);
    tmpl.input_annotations_.emplace_back();
    if (now == before_[i]) continue;
    // A changed input: annotated inside the region (then its new value is the input too, and
    // each instantiation annotates again), or written (an in-place update, e.g. AOTAutograd's
    // copy_ of a buffer's new value: each instantiation writes the value its nodes compute).
    const Sharding& annotation = slot->annotation;
    if (annotation.valid() && !(annotation == annotations_before_[i])) {
      tmpl.input_annotations_.back() = annotation;
      input_of.emplace(now, static_cast<int>(i));
    } else {
      written.emplace_back(static_cast<int>(i), now);
    }
  }
}

std::string TemplateCapture::CaptureNodes(GraphTemplate& tmpl, const std::vector<ir::Value>& roots,
                                          const InputOf& input_of,
                                          std::unordered_map<const ir::Node*, int>& spec_of) const {
  std::vector<std::pair<const ir::Value*, size_t>> stack;  // (value, next operand to visit)
  for (const ir::Value& root : roots) {
    if (input_of.count(root) || spec_of.count(root.node.get())) continue;
    stack.push_back({&root, 0});
    while (!stack.empty()) {
      auto& [value, next] = stack.back();
      const ir::NodePtr& node = value->node;
      if (next < node->inputs().size()) {
        const ir::Value& in = node->input(next++);
        if (!input_of.count(in) && !spec_of.count(in.node.get())) stack.push_back({&in, 0});
        continue;
      }
      stack.pop_back();
      if (node->id() < first_node_id_)
        return "the region read a value from before the call that is not one of its inputs (" +
               node->op()->qualified + ")";
      bool depends = node->draws_random_numbers();
      std::vector<GraphTemplate::Ref> refs;
      for (const ir::Value& in : node->inputs()) {
        refs.push_back(RefOf(in, input_of, spec_of));
        depends = depends || refs.back().kind != GraphTemplate::Ref::Kind::kConstant;
      }
      if (!depends) {
        spec_of[node.get()] = -1;
        continue;
      }
      spec_of[node.get()] = static_cast<int>(tmpl.nodes_.size());
      tmpl.nodes_.push_back(
          {node->op(), std::move(refs),
           std::make_shared<const ir::Node::Attrs>(
               ir::Node::Attrs{node->args(), node->outputs(), node->shardings()}),
           node->scope(), node->in_backward(), node->draws_random_numbers()});
    }
  }
  return "";
}

std::shared_ptr<GraphTemplate> TemplateCapture::Finish(const std::vector<at::Tensor>& outputs,
                                                       std::string* why_not) {
  SPMD_CHECK(!finished_, "TemplateCapture::Finish called twice");
  finished_ = true;
  --t_open_captures;
  std::lock_guard<GraphLock> lock(GraphMutex());
  if (g_host_work.load(std::memory_order_relaxed) != host_work_before_) {
    *why_not = "the region ran work on the host (an eager fallback, a sync or a read)";
    return nullptr;
  }
  auto tmpl = std::make_shared<GraphTemplate>();
  InputOf input_of;
  std::vector<std::pair<int, ir::Value>> written;  // (input, the value written into it)
  CaptureInputs(*tmpl, input_of, written);
  std::vector<ir::Value> roots;  // the outputs, then the written values
  for (const at::Tensor& t : outputs)
    roots.push_back(GetLazyImpl(t, "a replayed output")->slot()->value);
  for (const auto& [input, value] : written) roots.push_back(value);
  std::unordered_map<const ir::Node*, int> spec_of;  // template node index, -1: constant
  if (std::string why = CaptureNodes(*tmpl, roots, input_of, spec_of); !why.empty()) {
    *why_not = std::move(why);
    return nullptr;
  }
  for (size_t k = 0; k < written.size(); ++k)
    tmpl->writes_.push_back(
        {written[k].first, RefOf(roots[outputs.size() + k], input_of, spec_of)});
  for (size_t k = 0; k < outputs.size(); ++k) {
    LazyImpl* impl = GetLazyImpl(outputs[k], "a replayed output");
    tmpl->outputs_.push_back({RefOf(roots[k], input_of, spec_of),
                              at::functionalization::impl::isFunctionalTensor(outputs[k]),
                              impl->sizes().vec(), impl->strides().vec(),
                              impl->storage_offset(), impl->slot()->annotation});
  }
  Count("GraphTemplateCaptures");
  return tmpl;
}

std::optional<GraphTemplate::Values> GraphTemplate::InputValues(
    const Values& leading, const std::vector<at::Tensor>& inputs) const {
  if (leading.size() + inputs.size() != input_types_.size()) return std::nullopt;
  Values values(leading);
  values.reserve(input_types_.size());
  for (const at::Tensor& t : inputs) {
    LazyImpl* impl = TryGetLazyImpl(t);
    if (!impl) return std::nullopt;
    values.push_back(impl->slot()->value);
  }
  for (size_t i = 0; i < values.size(); ++i)
    if (!(values[i].type() == input_types_[i])) return std::nullopt;
  // The same value where the capture had the same value, and distinct values elsewhere.
  std::unordered_map<ir::Value, int, ValueHash> first;
  for (size_t i = 0; i < values.size(); ++i) {
    auto [it, fresh] = first.emplace(values[i], static_cast<int>(i));
    if ((fresh ? -1 : it->second) != input_same_as_[i]) return std::nullopt;
  }
  for (size_t i = 0; i < values.size(); ++i) {
    if (!input_annotations_[i].valid()) continue;
    if (i < leading.size()) return std::nullopt;
    const at::Tensor& t = inputs[i - leading.size()];
    MarkSharding(t, input_annotations_[i]);
    values[i] = TryGetLazyImpl(t)->slot()->value;
  }
  for (const auto& [input, ref] : writes_)
    if (static_cast<size_t>(input) < leading.size()) return std::nullopt;
  return values;
}

GraphTemplate::Values GraphTemplate::Build(const Values& values, size_t num_leading,
                                           const std::vector<at::Tensor>& inputs) const {
  std::vector<ir::NodePtr> made;
  made.reserve(nodes_.size());
  auto value_of = [&](const Ref& r) -> ir::Value {
    switch (r.kind) {
      case Ref::Kind::kInput: return values[r.index];
      case Ref::Kind::kNode: return ir::Value{made[r.index], r.output};
      case Ref::Kind::kConstant: break;
    }
    return r.constant;
  };
  for (const NodeSpec& spec : nodes_) {
    std::vector<ir::Value> operands;
    operands.reserve(spec.inputs.size());
    for (const Ref& r : spec.inputs) operands.push_back(value_of(r));
    std::shared_ptr<const ir::Node::Attrs> attrs = spec.attrs;
    if (spec.random) {  // (attrs of its own: fresh seeds)
      auto fresh = std::make_shared<ir::Node::Attrs>(*attrs);
      DrawFreshSeeds(*spec.op, fresh->args);
      attrs = std::move(fresh);
    }
    ir::NodePtr node = ir::MakeNode(spec.op, std::move(operands), std::move(attrs));
    node->set_scope(spec.scope);
    node->set_in_backward(spec.in_backward);
    made.push_back(std::move(node));
  }
  for (const auto& [input, ref] : writes_) {  // after every node read the inputs' values
    const at::Tensor& t = inputs[input - num_leading];
    const SlotPtr& slot = TryGetLazyImpl(t)->slot();
    if (at::functionalization::impl::isFunctionalTensor(t))
      CommitInPlace(t, MakeLazyTensor(value_of(ref)), slot);
    else
      SetSlotValue(slot, value_of(ref));
  }
  Values outputs;
  outputs.reserve(outputs_.size());
  for (const OutputSpec& out : outputs_) outputs.push_back(value_of(out.ref));
  Count("GraphTemplateReplays");
  return outputs;
}

at::Tensor GraphTemplate::OutputTensor(const OutputSpec& out, const ir::Value& value) const {
  at::Tensor t = MakeLazyTensor(value);
  auto* impl = static_cast<LazyImpl*>(t.unsafeGetTensorImpl());
  if (impl->strides() != c10::IntArrayRef(out.strides) || out.storage_offset != 0) {
    impl->set_sizes_and_strides(out.sizes, out.strides);
    impl->set_storage_offset(out.storage_offset);
  }
  impl->slot()->annotation = out.annotation;
  return out.functional ? at::functionalization::impl::to_functional_tensor(t) : t;
}

std::optional<std::vector<at::Tensor>> GraphTemplate::Instantiate(
    const std::vector<at::Tensor>& inputs) const {
  return InstantiateAfter({}, inputs);
}

std::optional<std::vector<at::Tensor>> GraphTemplate::InstantiateAfter(
    const Values& leading, const std::vector<at::Tensor>& inputs) const {
  std::lock_guard<GraphLock> lock(GraphMutex());
  std::optional<Values> values = InputValues(leading, inputs);
  if (!values) return std::nullopt;
  Values made = Build(*values, leading.size(), inputs);
  std::vector<at::Tensor> outputs;
  outputs.reserve(made.size());
  for (size_t k = 0; k < made.size(); ++k) outputs.push_back(OutputTensor(outputs_[k], made[k]));
  return outputs;
}

std::optional<std::pair<std::vector<at::Tensor>, GraphTemplate::Values>>
GraphTemplate::InstantiateKeeping(const std::vector<at::Tensor>& inputs,
                                  const std::vector<int>& returned,
                                  const std::vector<std::pair<KeptFrom, int>>& kept) const {
  std::lock_guard<GraphLock> lock(GraphMutex());
  auto valid = [](int i, size_t n) { return i >= 0 && static_cast<size_t>(i) < n; };
  for (int k : returned)
    if (!valid(k, outputs_.size())) return std::nullopt;
  for (const auto& [from, i] : kept)
    if (!valid(i, from == KeptFrom::kOutput ? outputs_.size() : inputs.size())) return std::nullopt;
  std::optional<Values> values = InputValues({}, inputs);
  if (!values) return std::nullopt;
  Values made = Build(*values, 0, inputs);
  std::vector<at::Tensor> outputs;
  outputs.reserve(returned.size());
  for (int k : returned) outputs.push_back(OutputTensor(outputs_[k], made[k]));
  Values keep;
  keep.reserve(kept.size());
  for (const auto& [from, i] : kept) keep.push_back(from == KeptFrom::kOutput ? made[i] : (*values)[i]);
  return std::make_pair(std::move(outputs), std::move(keep));
}

}  // namespace spmd::aten
