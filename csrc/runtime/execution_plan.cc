#include "runtime/execution_plan.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <unordered_map>

#include "core/error.h"
#include "ir/internal_attrs.h"
#include "ir/internal_ops.h"
#include "runtime/device_set.h"
#include "runtime/process_span.h"

namespace spmd::runtime {

namespace {
bool EnvFlag(const char* name, bool otherwise) {
  const char* env = std::getenv(name);
  return env == nullptr ? otherwise : std::string(env) != "0";
}

bool FoldingEnabled() {
  static const bool enabled = EnvFlag("SPMD_FOLD", true) && !RowExactExecution();
  return enabled;
}
}  // namespace

bool RowExactExecution() {
  static const bool exact = EnvFlag("SPMD_EXACT_ROWS", false);
  return exact;
}

namespace {

// The view op `x` of a functionalized view `x_copy` with the same arguments, or null.
const c10::OperatorHandle* ViewKernelFor(const ir::OpInfo* op) {
  const std::string suffix = "_copy";
  const std::string& name = op->name;
  if (name.size() <= suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix))
    return nullptr;
  static std::mutex mu;
  static auto* cache = new std::unordered_map<const ir::OpInfo*, const c10::OperatorHandle*>();
  std::lock_guard<std::mutex> lock(mu);
  auto [it, added] = cache->emplace(op, nullptr);
  if (!added) return it->second;
  auto handle = c10::Dispatcher::singleton().findSchema(
      {name.substr(0, name.size() - suffix.size()), op->overload});
  if (handle && handle->schema().arguments().size() == op->args.size() &&
      handle->schema().returns().size() == KernelFor(op).schema().returns().size())
    it->second = new c10::OperatorHandle(*handle);  // lives as long as the op registry
  return it->second;
}

// Whether `node` is elementwise (its traits say so), and the local rank each input must have
// to run stacked as it is: that of the result it broadcasts into (element i of a list argument
// into result i; a lone tensor beside lists must not vary over devices: -1).
void ElementwiseRanks(const ir::Node& node, const partition::OpTraits& traits, bool* elementwise,
                      std::vector<int>* rank) {
  *elementwise = traits.elementwise;
  for (const ir::Arg& a : node.args())  // channels-last has no meaning for a stacked tensor
    if (a.kind == ir::Arg::Kind::kMemoryFormat &&
        a.i >= static_cast<int64_t>(c10::MemoryFormat::ChannelsLast))
      *elementwise = false;
  if (!*elementwise) return;
  bool lists = false;
  for (const ir::Arg& a : node.args()) lists |= a.kind == ir::Arg::Kind::kTensorList;
  rank->assign(node.inputs().size(), lists ? -1 : static_cast<int>(node.output(0).rank()));
  for (const ir::Arg& a : node.args()) {
    if (a.kind != ir::Arg::Kind::kTensorList) continue;
    for (size_t i = 0; i < a.ints.size(); ++i)
      if (static_cast<int>(i) < node.num_outputs())
        (*rank)[a.ints[i]] = static_cast<int>(node.output(i).rank());
  }
}

bool HasBatchRule(const c10::OperatorHandle& op) {
  return op.hasKernelForDispatchKey(c10::DispatchKey::FuncTorchBatched) ||
         op.hasKernelForDispatchKey(c10::DispatchKey::FuncTorchBatchedDecomposition) ||
         op.hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd);
}

c10::Scalar ToScalar(const ir::Arg& a) {
  switch (a.kind) {
    case ir::Arg::Kind::kScalarInt: return c10::Scalar(a.i);
    case ir::Arg::Kind::kScalarBool: return c10::Scalar(static_cast<bool>(a.i));
    default: return c10::Scalar(a.d);
  }
}

// The IValue for a constant (non-tensor, non-dynamic) argument.
c10::IValue ConstantIValue(const ir::Arg& a) {
  using K = ir::Arg::Kind;
  switch (a.kind) {
    case K::kNone: return c10::IValue();
    case K::kBool: return c10::IValue(static_cast<bool>(a.i));
    case K::kInt: return c10::IValue(a.i);
    case K::kDouble: return c10::IValue(a.d);
    case K::kIntList: return c10::IValue(a.ints);
    case K::kDoubleList: return c10::IValue(a.doubles);
    case K::kBoolList: {
      c10::List<bool> l;
      for (int64_t v : a.ints) l.push_back(v != 0);
      return c10::IValue(l);
    }
    case K::kString: return c10::IValue(a.s);
    case K::kScalarInt:
    case K::kScalarDouble:
    case K::kScalarBool:
      return ScalarIValue(ToScalar(a), a.wrapped);
    case K::kScalarType:
    case K::kLayout:
    case K::kMemoryFormat: return c10::IValue(a.i);
    case K::kDevice: return c10::IValue(c10::Device(c10::kCPU));
    default: return c10::IValue();  // tensors are filled in per run
  }
}

// Lowers one program; the steps run in order, each reading what the earlier ones decided.
class Planner {
 public:
  explicit Planner(const partition::Program& program) : program_(program) {}
  ExecutionPlan Plan();

 private:
  Instruction LowerNode(const ir::NodePtr& n, const std::function<int(const ir::Value&)>& slot_of);
  std::vector<int> PlanLiveness();
  void PlanViews(const std::vector<int>& last_use);
  void PlanFolds();
  // Whether output `output` of instruction `index` reaches an all-reduce or reduce-scatter
  // (sum) over exactly `axes` through views and additive ops, each read once. `additive`
  // (optional) receives the additive ops on the way.
  bool ReachesReduction(size_t index, int output, const std::vector<int>& axes,
                        const std::vector<std::vector<int>>& readers,
                        const std::vector<bool>& is_output,
                        std::vector<size_t>* additive = nullptr) const;
  // Whether `ins` is an additive op whose pending sum is over exactly `axes` (sorted).
  bool PassesGroupSums(const Instruction& ins, const std::vector<int>& axes) const;

  const partition::Program& program_;
  std::vector<Instruction> instructions_;
  std::vector<int> param_slots_;
  std::vector<int> output_slots_;
  int num_slots_ = 0;
};

}  // namespace

const c10::OperatorHandle& KernelFor(const ir::OpInfo* op) {
  void* cached = op->backend.load(std::memory_order_acquire);
  if (cached) return *static_cast<const c10::OperatorHandle*>(cached);
  auto handle = c10::Dispatcher::singleton().findSchemaOrThrow(op->name.c_str(),
                                                               op->overload.c_str());
  auto* owned = new c10::OperatorHandle(handle);  // lives as long as the op registry
  void* expected = nullptr;
  if (!op->backend.compare_exchange_strong(expected, owned)) delete owned;
  return *static_cast<const c10::OperatorHandle*>(op->backend.load());
}

c10::IValue ScalarIValue(const c10::Scalar& s, bool wrapped) {
  if (!wrapped) return c10::IValue(s);
  at::Tensor t = at::scalar_to_tensor(s);
  t.unsafeGetTensorImpl()->set_wrapped_number(true);
  return c10::IValue(t);
}

bool WritesAnInput(const Instruction& ins) {
  return std::find(ins.mutable_input.begin(), ins.mutable_input.end(), true) !=
         ins.mutable_input.end();
}

ExecutionPlan PlanExecution(const partition::Program& program) { return Planner(program).Plan(); }

ExecutionPlan Planner::Plan() {
  std::unordered_map<const ir::Node*, int> first_slot;  // node -> slot of its output 0
  for (const ir::NodePtr& n : program_.nodes) {
    first_slot[n.get()] = num_slots_;
    num_slots_ += n->num_outputs();
  }
  auto slot_of = [&](const ir::Value& v) { return first_slot.at(v.node.get()) + v.index; };
  for (const ir::NodePtr& p : program_.params) param_slots_.push_back(slot_of(ir::Value{p, 0}));
  for (const ir::Value& v : program_.outputs) output_slots_.push_back(slot_of(v));

  const ir::OpInfo* data_op = ir::InternalOps::Get().device_data;
  for (const ir::NodePtr& n : program_.nodes)
    if (n->op() != data_op) instructions_.push_back(LowerNode(n, slot_of));

  const std::vector<int> last_use = PlanLiveness();
  PlanViews(last_use);
  PlanFolds();
  return ExecutionPlan{std::move(instructions_), std::move(param_slots_),
                       std::move(output_slots_), num_slots_};
}

// One node as an instruction: its slots, its kernel (resolved now, so that a missing op fails
// at compile time) and, for an ATen op, its prebuilt argument stack.
Instruction Planner::LowerNode(const ir::NodePtr& n,
                                              const std::function<int(const ir::Value&)>& slot_of) {
  Instruction ins;
  ins.node = n.get();
  ins.node_index = static_cast<int>(&n - program_.nodes.data());
  for (const ir::Value& v : n->inputs()) ins.inputs.push_back(slot_of(v));
  for (int o = 0; o < n->num_outputs(); ++o) ins.outputs.push_back(slot_of(ir::Value{n, o}));
  ins.mutable_input.assign(n->inputs().size(), false);
  if (n->op()->internal) {
    ins.internal_kernel = FindInternalKernel(n->op()->qualified);
    ins.stacked_kernel = FindStackedKernel(n->op()->qualified);
    SPMD_CHECK(ins.internal_kernel || ins.stacked_kernel, "no runtime kernel for ",
               n->op()->qualified);
    ins.on_host = n->op() == ir::InternalOps::Get().place_to_host;
  } else {
    ins.view_kernel = ViewKernelFor(n->op());
    ins.batch_rule = HasBatchRule(ins.view_kernel ? *ins.view_kernel : KernelFor(n->op()));
    ElementwiseRanks(*n, program_.TraitsAt(ins.node_index), &ins.elementwise,
                     &ins.element_rank);
    const auto& schema_args = n->op()->args;
    for (size_t a = 0; a < n->args().size(); ++a) {
      const ir::Arg& arg = n->args()[a];
      int pos = static_cast<int>(a);
      using K = ir::Arg::Kind;
      if (a >= schema_args.size()) {
        // The seed the recorder appended for a random op without a Generator argument.
        SPMD_CHECK(arg.dynamic, "unexpected extra argument of ", n->op()->qualified);
        SPMD_CHECK(arg.slot >= 0, "internal error: run-time seed without a slot in ",
                   n->op()->qualified);
        ins.default_generator_seed = arg.slot;
        ins.random = true;
        continue;
      }
      if (arg.kind == K::kTensor) {
        ins.tensor_args.emplace_back(pos, static_cast<int>(arg.i));
        if (a < schema_args.size() && schema_args[a].is_write) ins.mutable_input[arg.i] = true;
      } else if (arg.kind == K::kTensorList || arg.kind == K::kOptTensorList) {
        ins.list_args.push_back({pos, arg.ints, arg.kind == K::kOptTensorList});
      } else if (arg.dynamic) {
        SPMD_CHECK(arg.slot >= 0, "internal error: run-time scalar without a slot in ",
                   n->op()->qualified);
        bool generator = a < schema_args.size() && schema_args[a].type == ir::ArgType::kGenerator;
        const int list_size =
            arg.kind == K::kScalarList ? static_cast<int>(arg.doubles.size()) : -1;
        ins.scalar_args.push_back({pos, arg.slot, arg.wrapped, generator, list_size});
        ins.random |= generator;
      }
      ins.stack.push_back(ConstantIValue(arg));
    }
    // Merging device rows into a dim: not for ops that write an input (batch norm's running
    // statistics: one per device) nor for views (their copy is made after).
    if (!ins.view_kernel && std::find(ins.mutable_input.begin(), ins.mutable_input.end(),
                                      true) == ins.mutable_input.end())
      ins.merge = MergeFactorsOf(*n, program_.TraitsAt(ins.node_index));
  }
  for (int o = 0; o < n->num_outputs(); ++o)
    ins.labels.push_back(InternLabel(n->op()->qualified + " -> " + n->output(o).ToString()));
  return ins;
}

// Frees each slot right after its last reader (outputs never); returns each slot's last
// reader (-2: a program output, -1: never read).
std::vector<int> Planner::PlanLiveness() {
  std::vector<int> last_use(num_slots_, -1);
  for (size_t i = 0; i < instructions_.size(); ++i)
    for (int s : instructions_[i].inputs) last_use[s] = static_cast<int>(i);
  for (int s : output_slots_) last_use[s] = -2;
  for (int s = 0; s < num_slots_; ++s)
    if (last_use[s] >= 0) instructions_[last_use[s]].free_after.push_back(s);
  // Outputs nobody reads (e.g. the unused second result of an op) are freed at once.
  for (auto& ins : instructions_)
    for (int s : ins.outputs)
      if (last_use[s] == -1) ins.free_after.push_back(s);
  return last_use;
}

void Planner::PlanViews(const std::vector<int>& last_use) {
  // Zero-copy views (view_aliasing.h). A strided (permuted) result must stay inside the
  // program and reach only kernels that accept any strides.
  std::vector<bool> strided_ok(num_slots_, true);
  for (int s : output_slots_) strided_ok[s] = false;
  for (auto& ins : instructions_) {
    // Stacked kernels read any strides (a transposed gradient all-reduced as it is).
    bool internal = ins.node->op()->internal && !ins.stacked_kernel;
    // Kernels over tensor lists (multi-tensor apply, the fused optimizers) read raw memory
    // chunks: a strided input (a row split from a merged call) is made contiguous for them.
    ins.contiguous_inputs =
        (!ins.node->op()->internal && program_.TraitsAt(ins.node_index).reads_strides) ||
        !ins.list_args.empty();
    if (internal || ins.contiguous_inputs)
      for (int s : ins.inputs) strided_ok[s] = false;
  }
  for (auto& ins : instructions_) {
    if (ins.node->op()->internal || WritesAnInput(ins)) continue;
    ins.alias = ViewAliasOf(*ins.node, program_.TraitsAt(ins.node_index));
    // A strided view is the op's own view kernel, run on the input's rows.
    if ((ins.alias == ViewKind::kPermute || ins.alias == ViewKind::kSubset) &&
        (!strided_ok[ins.outputs[0]] || !ins.view_kernel))
      ins.alias = ViewKind::kNone;
    // A view (a reshape, transpose or select of its input's bytes) that dies before its input,
    // and stays inside the program, holds nothing of its own: it is the input's memory seen
    // differently, as XLA's bitcasts and transposes folded into their consumer are.
    const int base = ins.inputs.empty() ? -1 : ins.inputs[0], view = ins.outputs[0];
    ins.share_input = ins.alias != ViewKind::kNone && last_use[view] >= 0 &&
                      (last_use[base] == -2 || last_use[view] <= last_use[base]);
  }
}

// Contractions whose summed results meet their reduction (fold.h).
void Planner::PlanFolds() {
  // A fold reads every member's operands at once: with the members in several processes
  // (process_span.h) they are not all here. SPMD_FOLD=0 turns folding off (the reductions then
  // add the members' partial sums in member order, as they do across processes).
  if (ProcessSpan::Current() || !FoldingEnabled()) return;
  std::vector<std::vector<int>> readers(num_slots_);
  for (size_t i = 0; i < instructions_.size(); ++i)
    for (int s : instructions_[i].inputs)
      if (readers[s].empty() || readers[s].back() != static_cast<int>(i)) readers[s].push_back(i);
  std::vector<bool> is_output(num_slots_, false);
  for (int s : output_slots_) is_output[s] = true;
  for (size_t i = 0; i < instructions_.size(); ++i) {
    Instruction& ins = instructions_[i];
    if (ins.random || WritesAnInput(ins)) continue;
    ins.fold = FoldPlanOf(*ins.node, program_.TraitsAt(ins.node_index),
                          [&](int output, const std::vector<int>& axes) {
      return ReachesReduction(i, output, axes, readers, is_output);
    });
    if (!ins.fold) continue;
    // The additive ops on the way compute on group sums when the fold happens: their one
    // result summed, as the contraction's.
    auto sums = std::make_shared<const FoldPlan>(FoldPlan{ins.fold->groups, {}, {-1}});
    for (size_t o = 0; o < ins.fold->result_dim.size(); ++o) {
      if (ins.fold->result_dim[o] != -1) continue;
      const Sharding& layout = ins.node->shardings()[o];
      std::vector<int> axes(layout.partial_axes().begin(), layout.partial_axes().end());
      std::vector<size_t> additive;
      ReachesReduction(i, static_cast<int>(o), axes, readers, is_output, &additive);
      for (size_t a : additive) instructions_[a].sums_over = sums;
    }
  }
}

bool Planner::ReachesReduction(size_t index, int output, const std::vector<int>& axes,
                                  const std::vector<std::vector<int>>& readers,
                                  const std::vector<bool>& is_output,
                                  std::vector<size_t>* additive) const {
  int slot = instructions_[index].outputs[output];
  while (!is_output[slot] && readers[slot].size() == 1) {
    const size_t reader = readers[slot][0];
    const Instruction& next = instructions_[reader];
    if (next.node->op()->internal) {
      const ir::InternalOps& ops = ir::InternalOps::Get();
      if (next.node->op() != ops.all_reduce && next.node->op() != ops.reduce_scatter)
        return false;
      ir::SpmdAttrs attrs = ir::SpmdAttrs::Read(*next.node->op(), next.node->args());
      std::vector<int> reduced(attrs.axes.begin(), attrs.axes.end());
      std::sort(reduced.begin(), reduced.end());
      return attrs.op == ReduceOp::kSum && next.stacked_kernel && reduced == axes;
    }
    if (next.alias == ViewKind::kNone) {  // not a view: an additive op, or the path ends
      if (!PassesGroupSums(next, axes)) return false;
      if (additive) additive->push_back(reader);
    }
    slot = next.outputs[0];
  }
  return false;
}

bool Planner::PassesGroupSums(const Instruction& ins, const std::vector<int>& axes) const {
  if (!program_.TraitsAt(ins.node_index).additive || ins.outputs.size() != 1 || ins.random ||
      WritesAnInput(ins) || ins.node->shardings().size() != 1)
    return false;
  const Sharding& layout = ins.node->shardings()[0];
  if (!layout.valid() || !layout.IsPartial() || layout.partial_op() != ReduceOp::kSum)
    return false;
  std::vector<int> pending(layout.partial_axes().begin(), layout.partial_axes().end());
  std::sort(pending.begin(), pending.end());
  return pending == axes;
}

}  // namespace spmd::runtime
