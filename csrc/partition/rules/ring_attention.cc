// Ring attention (Liu, Zaharia and Abbeel, 2023; torchtitan's and MaxText's context
// parallelism): queries, keys and values tiled alike along the sequence over a group of n
// devices; step t pairs member i's queries with the key/value tile of member (i + t) mod n,
// received from member i + 1 while the step before computes (a collective-permute per tile per
// step). The gathered keys are never held: a device holds two key/value tiles (the one it
// computes with, the one arriving).
//
//   forward:  (o_t, lse_t) = attention(q, k_j, v_j)
//             lse' = logaddexp(lse, lse_t)                       (the online softmax: each
//             o'   = o exp(lse - lse') + o_t exp(lse_t - lse')    block's own normalizer;
//                  = o + exp(lse_t - lse') (o_t - o)              the weights add up to 1)
//   backward: with the forward's out and lse (the global ones), the kernel's gradients of a
//             block are exact parts of the whole: dq = sum_t dq_t, and tile j's dk_j, dv_j are
//             running sums that travel with it (member i - 1 receives them after each step,
//             as the tile itself), home after n permutes.
//
// The running output and lse are kept in lse's dtype (fp32 for 16-bit queries). Causal
// attention masks each block by global positions (an additive mask made on the device); a row
// that sees no key of a block (the kernel then gives out 0 and lse 0) keeps its running values.
// In sequence order, member n - 1 would see every earlier tile whole while member 0 sees only
// its own: the devices run in lockstep, so each step would cost a whole block. So causal
// attention runs in the load-balanced order (torchtitan's and MaxText's): halving each tile
// into 2n chunks, member i holds chunks 2i and 2n - 1 - 2i (its own first half and the second
// half of member n - 1 - i's tile, swapped in by one collective-permute of half a tile per
// operand, and back for each result); then every block pairs exactly half its (query, key)
// chunks causally, on every member at every step, and the cost model charges each step half a
// block (the kernels of a real pod skip masked tiles). Odd tiles keep the sequence order.
#include "ir/internal_ops.h"
#include "partition/halo.h"
#include "partition/ring.h"
#include "partition/rules/attention.h"
#include "partition/rules/local_ops.h"
#include "partition/rules/rule.h"

namespace spmd::partition {

namespace {

using ir::Arg;
using ir::ArgType;

constexpr int64_t kSeq = 2;  // the sequence dim of q, k, v, out, grad_out and lse

class Ring {
 public:
  Ring(LocalBuilder& b, const AttentionNode& a, const std::vector<LocalValue>& operands,
       const AxisList& axes)
      : b_(b), a_(a), ops_(operands), axes_(axes), n_(AxesSize(b.mesh(), axes)),
        rows_(operands[a.q].local_shape()[kSeq]), cols_(operands[a.k].local_shape()[kSeq]),
        balanced_(a.causal && rows_ == cols_ && rows_ % 2 == 0) {
    if (!a.causal) return;
    if (balanced_)
      for (int i : {a.q, a.k, a.v, a.grad_out, a.out, a.lse})
        if (i >= 0) ops_[i] = Balance(ops_[i]);
    q_rows_ = Positions(rows_, 0);
    q_rows_column_ = Unsqueezed(b, q_rows_);
  }

  std::vector<LocalValue> Forward() {
    const TensorType& out_global = b_.node().output(0);
    const TensorType& lse_global = b_.node().output(1);
    const Sharding out_layout = b_.result_layout(0), lse_layout = b_.result_layout(1);
    const std::vector<TensorType> outs = {Local(out_global, out_layout),
                                          Local(lse_global, lse_layout)};
    const DType acc = lse_global.dtype;
    LocalValue k = ops_[a_.k], v = ops_[a_.v], o, lse;
    for (int64_t t = 0; t < n_; ++t) {
      b_.BeginCostStep(Share(t), 'k');
      LocalValue k_next, v_next;
      if (t + 1 < n_) {
        k_next = RingPermute(b_, k, axes_, /*to_next=*/false);
        v_next = RingPermute(b_, v, axes_, false);
      }
      std::vector<LocalValue> r = Kernel(t, k, v, outs, {out_layout, lse_layout},
                                         {out_global, lse_global});
      if (t == 0) {  // every row sees a key of its own tile
        o = r[0].value.type().dtype == acc ? r[0] : CastTo(b_, r[0], acc);
        lse = r[1];
      } else {
        Merge(t, r[0], r[1], o, lse);
      }
      k = k_next;
      v = v_next;
    }
    if (o.value.type().dtype != out_global.dtype) o = CastTo(b_, o, out_global.dtype);
    return {Unbalance(o), Unbalance(lse)};
  }

  std::vector<LocalValue> Backward() {
    const ir::Node& node = b_.node();
    LocalValue k = ops_[a_.k], v = ops_[a_.v];
    const Sharding q_layout = b_.result_layout(0);
    const std::vector<Sharding> layouts = {q_layout, k.layout, v.layout};
    const std::vector<TensorType> globals = {node.output(0), node.output(1), node.output(2)};
    const std::vector<TensorType> outs = {Local(globals[0], q_layout), Local(globals[1], k.layout),
                                          Local(globals[2], v.layout)};
    LocalValue dq, dk, dv;  // dk, dv: the running sums of the tile received last
    for (int64_t t = 0; t < n_; ++t) {
      b_.BeginCostStep(Share(t), 'k');
      LocalValue k_next, v_next;
      if (t + 1 < n_) {
        k_next = RingPermute(b_, k, axes_, false);
        v_next = RingPermute(b_, v, axes_, false);
      }
      std::vector<LocalValue> g = Kernel(t, k, v, outs, layouts, globals);
      if (t == 0) {
        dq = g[0];
        dk = g[1];
        dv = g[2];
      } else {
        b_.BeginCostStep(0.0, 'k');  // the sums wait for the running sums' permutes
        dq = Accumulate(dq, g[0]);
        dk = Accumulate(dk, g[1]);
        dv = Accumulate(dv, g[2]);
      }
      // Tile j's sums go where tile j goes next; after the last step, home.
      dk = RingPermute(b_, dk, axes_, false);
      dv = RingPermute(b_, dv, axes_, false);
      k = k_next;
      v = v_next;
    }
    return {Unbalance(dq), Unbalance(dk), Unbalance(dv)};
  }

 private:
  static TensorType Local(const TensorType& global, const Sharding& layout) {
    return TensorType{global.dtype, LocalShape(global.shape, layout)};
  }

  // Of the op's cost (its rule's count, a causal one about half the pairs), the share of step
  // t: 1 / n each, balanced or not causal; in sequence order, the diagonal block's causal part,
  // then a whole block per step (the member that sees a whole block sets the pace).
  double Share(int64_t t) const {
    if (!a_.causal || balanced_) return 1.0 / static_cast<double>(n_);
    const double blocks = static_cast<double>(n_) * CausalFraction(a_.L, a_.S);
    return (t == 0 ? CausalFraction(rows_, cols_) : 1.0) / blocks;
  }

  // sum + part, written over the running sum.
  LocalValue Accumulate(const LocalValue& sum, const LocalValue& part) {
    const LocalValue r = Binary(b_, "aten::add.Tensor", sum, part);
    b_.program().MarkInPlace(r.value.node.get(), 0);
    return r;
  }

  // The load-balanced order and back (the same swap): the second half of the sequence tile of
  // member i and that of member n - 1 - i trade places.
  LocalValue Balance(const LocalValue& x) {
    const int64_t half = x.local_shape()[kSeq] / 2;
    std::vector<int64_t> pairs;
    for (int64_t m = 0; m < n_; ++m) pairs.insert(pairs.end(), {m, n_ - 1 - m});
    const LocalValue moved = PermuteTiles(b_, SliceRows(b_, x, kSeq, half, half), axes_, pairs);
    return Concat(b_, {SliceRows(b_, x, kSeq, 0, half), moved}, kSeq);
  }
  LocalValue Unbalance(const LocalValue& x) { return balanced_ ? Balance(x) : x; }

  // The global positions of the `tile` sequence rows that member i holds of member
  // (i + shift) mod n's tile: [tile] int64.
  LocalValue Positions(int64_t tile, int64_t shift) {
    if (!balanced_) return TilePositions(b_, axes_, tile, shift, /*column=*/false);
    const int64_t half = tile / 2;
    const LocalValue rows = Range(b_, 0, half, 1);
    const LocalValue own =  // m * tile + [0, half), m = (i + shift) mod n
        Binary(b_, "aten::add.Tensor", rows, TileTable(b_, axes_, 0, tile, shift));
    const LocalValue mirrored =  // (n - 1 - m) * tile + half + [0, half)
        Binary(b_, "aten::add.Tensor", rows,
               TileTable(b_, axes_, (n_ - 1) * tile + half, -tile, shift));
    return Concat(b_, {own, mirrored}, 0);
  }

  // The kernel on the queries and key/value tile (i + t) mod n.
  std::vector<LocalValue> Kernel(int64_t t, const LocalValue& k, const LocalValue& v,
                                 const std::vector<TensorType>& outs,
                                 const std::vector<Sharding>& layouts,
                                 const std::vector<TensorType>& globals) {
    std::vector<ir::Value> inputs;
    for (const LocalValue& x : ops_) inputs.push_back(x.value);
    inputs[a_.k] = k.value;
    inputs[a_.v] = v.value;
    if (!a_.causal || (t == 0 && !balanced_))  // (a diagonal block in order: top-left causal)
      return EmitAttention(b_, a_, std::move(inputs), a_.causal, nullptr, outs, layouts, globals);
    const LocalValue mask = CausalMask(b_, q_rows_column_, Positions(cols_, t),
                                       ops_[a_.q].value.type().dtype);
    return EmitAttention(b_, a_, std::move(inputs), false, &mask, outs, layouts, globals);
  }

  // The online softmax's step: (o, lse) and block t's (o_t, lse_t) into the running pair,
  // as o + w_t (o_t - o) with w_t = exp(lse_t - lse') (the two weights add up to 1).
  void Merge(int64_t t, const LocalValue& o_t, const LocalValue& lse_t, LocalValue& o,
             LocalValue& lse) {
    static const std::vector<ir::ArgSchema> two = {{"self", ArgType::kTensor},
                                                   {"other", ArgType::kTensor}};
    const LocalValue joint = b_.EmitOp("aten::logaddexp", two, {lse.value, lse_t.value},
                                       {Arg::Tensor(0), Arg::Tensor(1)}, lse.value.type(),
                                       lse.layout, lse.global);
    const LocalValue weight =  // [..., rows, 1]
        Unsqueezed(b_, Unary(b_, "aten::exp", Binary(b_, "aten::sub.Tensor", lse_t, joint)));
    const DType acc = o.value.type().dtype;  // (o_t promotes to it)
    const LocalValue step = Multiply(b_, Binary(b_, "aten::sub.Tensor", o_t, o, 1, acc), weight);
    b_.program().MarkInPlace(step.value.node.get(), 0);
    LocalValue merged = Accumulate(o, step);
    LocalValue merged_lse = joint;
    if (a_.causal) {  // rows before every key of this block keep their running values
      static const std::vector<ir::ArgSchema> self = {{"self", ArgType::kTensor}};
      const TensorType scalar{DType::kInt64, {}};
      const LocalValue first_key =
          b_.EmitOp("aten::min", self, {Positions(cols_, t).value}, {Arg::Tensor(0)}, scalar,
                    Sharding::Replicated(b_.program().mesh(), 0), scalar);
      merged = Where(b_, AtLeast(b_, q_rows_column_, first_key), merged, o);
      merged_lse = Where(b_, AtLeast(b_, q_rows_, first_key), merged_lse, lse);
      b_.program().MarkInPlace(merged.value.node.get(), 1);
    }
    o = merged;
    lse = merged_lse;
  }

  LocalBuilder& b_;
  const AttentionNode& a_;
  std::vector<LocalValue> ops_;  // the operands, in the load-balanced order when balanced_
  const AxisList& axes_;
  const int64_t n_, rows_, cols_;
  const bool balanced_;
  LocalValue q_rows_, q_rows_column_;  // causal: the queries' global positions
};

}  // namespace

std::vector<LocalValue> LowerRingAttention(LocalBuilder& b, const AttentionNode& a,
                                           const std::vector<LocalValue>& operands,
                                           const AxisList& ring) {
  Ring r(b, a, operands, ring);
  return a.backward ? r.Backward() : r.Forward();
}

}  // namespace spmd::partition
