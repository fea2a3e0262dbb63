// Sharding rules in Shardy's factor form: an op's iteration space is a set of factors (loop
// indices); every operand and result dim is made of one factor (or several, major to minor, for
// reshapes) or of none (a dim that must be replicated, e.g. a broadcast dim of size 1).
//
//   mm:            [i,k], [k,j] -> [i,j]        k is a reduction factor
//   sum(dim=1):    [i,j] -> [i]                 j is a reduction factor
//   _softmax(d=1): [i,j] -> [i,j]               j needs replication
//   view [2,4,32] -> [8,32]: [i],[j],[k] -> [i j],[k]   (compound dim)
//
// Sharding a pass-through factor over mesh axes shards every dim made of it, with no
// communication. Sharding a reduction factor leaves the results partial (pending a reduction
// over those axes). A need-replication factor is never sharded. A windowed factor (a spatial dim
// of a convolution or pooling, see Factor::windowed) is pass-through with halos. Propagation,
// partitioning and cost estimates all read these rules: op semantics are written once, here.
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ir/node.h"
#include "partition/op_traits.h"
#include "sharding/sharding.h"

namespace spmd::partition {

enum class FactorKind : uint8_t { kPassThrough, kReduction, kNeedReplication };

struct Factor {
  int64_t size = 1;
  FactorKind kind = FactorKind::kPassThrough;
  ReduceOp reduce = ReduceOp::kSum;  // for reduction factors: how partial results combine
  // For reduction factors: the padding of an unevenly sharded dim made of this factor must be
  // filled with this value before the local op reads it (the reduction's identity).
  double pad_value = 0.0;
  // Mask the padding with pad_value even when the factor is not a reduction (e.g. class
  // indices must read ignore_index there, or the kernel rejects them).
  bool always_mask = false;
  // Windowed factor (a spatial dim of convolution/pooling; GSPMD's windowed dims): the dims
  // made of it may have different extents (input rows L, output rows O), and a result tile
  // reads a window of operand rows reaching into its neighbours' tiles. The rule's `lower`
  // fetches those rows with a halo exchange (partition/halo.h). So that every device runs the
  // same local op with uniform halos, AssignFactors shards such a factor only into tiles that
  // divide every dim made of it evenly (input and output tiles line up), and into at most
  // `max_tiles` tiles (a halo may only come from the direct neighbours); otherwise it stays
  // unsharded and the operands are gathered. A windowed factor must be a dim's only factor.
  bool windowed = false;
  int64_t max_tiles = 0;  // windowed factors only; 0 = no limit
  // Pass-through factor over which the op on concatenated tiles is not the op on each tile
  // side by side: a result element reads the operands at every index of it (a softmax's dim)
  // or is placed by index values (the classes an nll_loss gradient writes at each target).
  // The result keeps the dim, so it may stay sharded, but then the rule's `lower` must make the
  // tiles agree (rules/softmax.cc, rules/nn.cc), and the executor never merges devices' rows
  // into it (runtime/row_merge.h).
  bool couples_tiles = false;
  // Independent iteration spaces within one op (the elements of a list op such as
  // _foreach_add): a mesh axis shards at most one factor of each group. Default: one group.
  int group = 0;
  // Reduction factors only: the op adds up its terms over this factor (a contraction, a sum, a
  // layer norm's weight gradient; not a mean, a norm, a max, nor addmm's contraction, whose
  // bias is added once). So the op on operands whose tiles of this factor are concatenated
  // gives, for each result without the factor, the sum of its values on each tile, and for
  // each result with it, those values side by side: the executor computes a partial result
  // that an all-reduce or reduce-scatter then sums in one such call (runtime/fold.h).
  bool sums = false;
  // When two factors of the op want the same mesh axis, the one of higher priority gets it
  // (AssignFactors; among equals, the one of the larger tensor). A factor whose sharding is
  // an option rather than the op's natural layout yields (-1): a vocab-parallel embedding's
  // table rows give way to the batch dims of its indices, so FSDP, sharding both over one
  // axis, still gathers the table instead of the activations.
  int priority = 0;
};

using DimFactors = std::vector<int>;  // the factors a dim is made of, major to minor
using TensorFactors = std::vector<DimFactors>;  // one entry per tensor dim

// The dim of `dims` made of factor f alone, -1 when f is absent, -2 when f shares a dim.
inline int DimOfFactor(const TensorFactors& dims, int f) {
  for (size_t d = 0; d < dims.size(); ++d)
    for (int g : dims[d])
      if (g == f) return dims[d].size() == 1 ? static_cast<int>(d) : -2;
  return -1;
}

class LocalBuilder;
struct LocalValue;

// An op's sharding rule, grouped by who reads it: the factors (propagation and factor
// assignment, and every reader below), the algebra (graph rewrites and pending sums), the
// lowering (the partitioner), the executor's traits (handed to the runtime as OpTraits) and
// the cost (partition/cost.cc and the plan floor).
struct ShardingRule {
  std::vector<Factor> factors;
  std::vector<TensorFactors> operands;  // one per node input (in node->inputs() order)
  std::vector<TensorFactors> results;   // one per node output
  // Per result, the factors it sums over. Default (empty): the reduction factors that do not
  // appear in that result. Needed when results reduce differently, e.g. convolution_backward's
  // grad_bias sums over batch and space but does not depend on the input channels at all.
  std::vector<std::vector<int>> reduced_in_result;

  // Operands whose values the op never reads, only their shape and dtype (zeros_like, new_*,
  // fill): they need the right tiling but not their pending partial sums reduced.
  std::vector<bool> shape_only_operands;
  // Operands the op reads nothing of but their dtype and device (new_zeros' self): taken in
  // whatever layout they have, never resharded (gathering one would only waste a collective).
  std::vector<bool> options_only_operands;

  // What the op's algebra lets the compiler rewrite or carry through it: partition/simplify.cc,
  // the partitioner's pending partial sums, host bookkeeping.
  struct Algebra {
    // The result is zeros with operand 0 written into [start, start + length) of `dim`
    // (select_backward: one index, the operand lacking the dim; slice_backward with step 1).
    // partition/simplify.cc joins sums of such results that cover the dim into one stack/cat.
    struct IntoZeros {
      int64_t dim = 0;
      int64_t start = 0;
      int64_t length = 1;
      bool stacked = false;  // the operand lacks `dim` (joined by stack, not cat)
    };
    std::optional<IntoZeros> into_zeros;

    // The result is rows [start, start + length) of operand 0 along `dim` (slice_copy with step
    // 1). partition/simplify.cc turns a cat of two such pieces of one tensor that swap its halves
    // (torch.cat([x[a:], x[:a]])) into torch.roll, whose rule keeps a sharded dim sharded.
    struct RowsOf {
      int64_t dim = 0;
      int64_t start = 0;
      int64_t length = 0;
    };
    std::optional<RowsOf> rows_of;

    // Operands the op is linear in, the other operands fixed: op(a + b) = op(a) + op(b) (views,
    // transposes, slices, negation, scaling, sums, exact casts). A pending partial *sum* in such
    // an operand may stay pending through the op, into every result, instead of being reduced
    // first; the partitioner does so when it is the only partial operand, its axes tile nothing
    // here, and no result is larger than it (a later reduction must not move more bytes; a result
    // of a wider dtype only when output reductions are deferred and it can stay pending to an
    // output).
    std::vector<bool> linear_operands;
    // The result is a fixed linear map of the tensor operands together (add, sub; cat and stack,
    // which place them side by side): when every operand holds a pending partial sum over the
    // same axes, op(a1 + a2, b1 + b2) = op(a1, b1) + op(a2, b2) and the sum stays pending
    // through the op (gradient accumulation across steps communicates once; the weight
    // gradients of a pipeline's stacked layers are reduced once, not once per layer).
    bool additive = false;
    // The result is the tensor operands placed side by side along a dim (cat, stack), or beside
    // constant blocks (a constant pad): its extent grows with theirs. Host bookkeeping
    // (aten/host_bookkeeping.h) runs such joins of token ids and masks on the host, so a
    // decoding loop's growing ids stay out of its graphs.
    bool joins = false;
    // The identity partition/simplify.cc rewrites the op by, if any: the sum of its two
    // operands (add with alpha 1: gradient pieces summed into zeros become one stack or cat),
    // its operands side by side (cat: the two halves of one tensor swapped become a roll), a
    // constant pad (a shifted copy filled with the constant becomes a roll and a mask).
    enum class Form : uint8_t { kNone, kSum, kConcatenation, kConstantPad };
    Form form = Form::kNone;
  };
  Algebra algebra;

  // How the partitioner emits the local computation.
  struct Lowering {
    // Emits the local computation given operands already in the layouts the factor assignment
    // asks for; returns one value per result. Unset: the same op with local shapes, with the
    // node's args rewritten by `local_args` (when set).
    std::function<std::vector<LocalValue>(LocalBuilder& b, const std::vector<LocalValue>& operands)>
        lower;
    // Rewrites shape-valued args (view sizes, expand sizes, factory sizes) for local shapes.
    std::function<std::vector<ir::Arg>(const ir::Node& node, const std::vector<Shape>& local_results)>
        local_args;
    // Local computation is not the same on every shard (e.g. arange over a sharded dim): only
    // replicated results are allowed, shards are sliced afterwards.
    bool results_must_replicate = false;

    // Operands the op can read a tile at a time around a ring instead of gathered whole (ring
    // attention, partition/ring.h): where the assignment gathers each of them over the same
    // mesh axes G on its dim of need-replication factor `factor`, they are tiled evenly over G
    // there, and G tiles `paired` exactly (each member's rows meet every tile of `factor`
    // once), the partitioner hands them to `lower` still tiled over G, with G; `lower` passes
    // the tiles around G's ring. Or, where `exchange` (a pass-through factor: attention's kv
    // heads) splits evenly over G as well and the options say so, it moves G from `paired`
    // onto `exchange` instead (all-to-alls; DeepSpeed's Ulysses) and the op runs as it is.
    struct Ring {
      int factor = -1;
      int paired = -1;
      int exchange = -1;
      std::vector<int> operands;
      std::function<std::vector<LocalValue>(LocalBuilder& b, const std::vector<LocalValue>& operands,
                                            const AxisList& ring)>
          lower;
    };
    std::optional<Ring> ring;
  };
  Lowering lowering;

  // What the executor may do with the local op (partition/op_traits.h hands it over).
  struct ExecutorTraits {
    // A leading dim added to the operands that have the result's rank, and to the results, is
    // computed alike, each of its indices on its own: every result element is computed from
    // the operand elements at the same index, operands broadcast onto the result from the
    // right (pointwise ops; each element of a list op), or at least the op's leading dims
    // behave so (matmul's batch dims). The executor runs such an op once over all devices'
    // stacked shards as it is (runtime/executable.cc), without a batching transform.
    bool elementwise = false;
    // The op's values may depend on the extents of its dims, not only on the elements at each
    // index (a loss backward with reduction=mean divides by the element count): the executor may
    // not run several devices' shards as one call with their rows merged into a dim
    // (runtime/row_merge.h). Conservative by default: a rule that forgets it costs speed (the
    // op runs under vmap or per row), never correctness. Rules whose kept dims are independent
    // say so (reads_extents = false, or ReadsNoExtents at registration).
    bool reads_extents = true;
    // The op only re-describes its operand's data (a view, transpose, permutation, broadcast,
    // slice), and how (ViewKind): an eager runtime hands back a strided view of the same
    // storage and a compiler folds it into its consumer's layout, so the step-time model
    // (plan/cost_model.h) charges it no bytes and no kernel, and the executor may return a
    // view of its operand's host memory (runtime/view_aliasing.h). Its FLOPs and bytes still
    // appear in the stats.
    ViewKind view = ViewKind::kNone;
    // The op's values depend on its operands' memory layout, not only on their elements
    // (explicit strides, a view that must be expressible on the operand's strides): the
    // executor hands it contiguous operands. ATen's kernels otherwise accept any strides.
    bool reads_strides = false;
  };
  ExecutorTraits executor;

  // What the op costs and holds (partition/cost.cc, the plan floor).
  struct Cost {
    // Cost, read by partition/cost.cc (which knows no op names): FLOPs per point of the op's
    // iteration space, the product of its factor sizes; mm's [i,k],[k,j] -> [i,j] is 2 (a
    // multiply and an add per (i,k,j)); 0 for ops that compute nothing (factories). Unset: one
    // FLOP per result element (pointwise ops; views and copies are counted the same way).
    std::optional<double> flops_per_point;

    // The op computes each result element from operand elements alone, without a reduction,
    // though it is no pointwise op (nll_loss_backward: the targets' one-hot, scaled): a compiling
    // runtime computes it inside its one reader's fusion, as it does a pointwise op
    // (PartitionOptions::fused_memory).
    bool fuses_into_reader = false;
    // Per result, the operand it is written over in place (-1: a buffer of its own): the op is an
    // in-place update that functionalization made functional (the fused optimizer steps, which
    // have no out-of-place form), so where that operand dies at the op the result takes its
    // memory (partition/cost.h) instead of being held beside it.
    std::vector<int> updates_operand;
    // The operand whose dtype the op's matrix units run at, where it is not the result's
    // (-1): an FP8 matmul accumulates into a wider result at the FP8 rate (plan/hardware.h).
    int compute_dtype_operand = -1;
  };
  Cost cost;

  int AddFactor(int64_t size, FactorKind kind = FactorKind::kPassThrough) {
    Factor f;
    f.size = size;
    f.kind = kind;
    factors.push_back(f);
    return static_cast<int>(factors.size()) - 1;
  }
};

// Builds the rule for one node, or nullopt when the op has no rule for these arguments (the
// partitioner then replicates every operand and counts the op as a replicated fallback).
using RuleBuilder = std::function<std::optional<ShardingRule>(const ir::Node& node)>;

// Registers `builder` for an op: a qualified name ("aten::add.Tensor") or a base name
// ("aten::add", matching every overload without a more specific rule).
void RegisterRule(const std::string& op_name, RuleBuilder builder);
void RegisterRules(const std::vector<std::string>& op_names, const RuleBuilder& builder);
// Registers `builder` for every op whose name starts with `prefix` and that has no rule of its
// own (a family such as "aten::_foreach_"), except the base names in `exclude`.
void RegisterRulePrefix(const std::string& prefix, RuleBuilder builder,
                        std::vector<std::string> exclude = {});
// The rule of `node`, nullptr when its op has none. Built once per distinct (op, args, input
// and output types) and shared: a partitioning asks for every node's rule several times, and a
// search partitions the same graph in many layouts (rule building and freeing was a fifth of
// propagation on a 70B step). Rules depend on nothing else of a node.
using RulePtr = std::shared_ptr<const ShardingRule>;
RulePtr GetRule(const ir::Node& node);
bool HasRuleFor(const std::string& qualified_name);
// Every registered name ("aten::add" for every overload, "aten::add.Tensor" for one), prefixes
// as "aten::_foreach_*"; sorted.
std::vector<std::string> RegisteredRuleNames();

// `inner` with ShardingRule::linear_operands set for the listed operand positions (-1: every
// operand).
RuleBuilder LinearIn(RuleBuilder inner, std::vector<int> operands = {0});
// `inner` with ShardingRule::additive set.
RuleBuilder Additive(RuleBuilder inner);
// `inner` with ShardingRule::joins set.
RuleBuilder Joins(RuleBuilder inner);
// `inner` with ShardingRule::view set to `kind`.
RuleBuilder AsView(RuleBuilder inner, ViewKind kind);
// `inner` with ShardingRule::Algebra::form set to `form`.
RuleBuilder WithForm(RuleBuilder inner, ShardingRule::Algebra::Form form);
// `inner` with ShardingRule::reads_extents cleared.
RuleBuilder ReadsNoExtents(RuleBuilder inner);
// `inner` with ShardingRule::reads_strides set.
RuleBuilder ReadsStrides(RuleBuilder inner);

// Helpers shared by rule files.
// One pass-through factor per dim of `type`; returns the factors.
TensorFactors PassThroughFactors(ShardingRule& rule, const TensorType& type);
// Maps operand `type` onto result factors right-aligned with broadcasting: size-1 dims that
// broadcast against a larger result dim get no factor.
TensorFactors BroadcastFactors(const TensorType& type, const TensorType& result,
                               const TensorFactors& result_factors);
// A `local_args` rewrite that sets the int-list arg at `size_index` to result 0's local shape
// and, when `stride_index` >= 0, the arg there to that shape's contiguous strides.
std::function<std::vector<ir::Arg>(const ir::Node&, const std::vector<Shape>&)> LocalSizeArgs(
    int size_index, int stride_index = -1);
// The integer list in arg `index` ({} when None), or the single int promoted to a list.
std::vector<int64_t> IntListArg(const ir::Node& node, int index);
int64_t IntArg(const ir::Node& node, int index, int64_t default_value = 0);
bool BoolArg(const ir::Node& node, int index, bool default_value = false);
// Index of the arg named `name` in the node's op schema, or -1.
int ArgIndex(const ir::Node& node, const char* name);
// The node input that the tensor arg named `name` refers to, or -1 (absent or None).
int InputOfArg(const ir::Node& node, const char* name);

}  // namespace spmd::partition
