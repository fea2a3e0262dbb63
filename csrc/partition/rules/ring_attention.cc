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
// The running output and lse, and the gradients' running sums, are kept in lse's dtype (fp32
// for 16-bit queries, as PyTorch's ring attention keeps them). Causal attention masks each
// block by global positions (an additive mask made on the device); a row
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
    if (balanced_) {
      for (int i : {a.k, a.v}) ops_[i] = Balance(ops_[i]);
      const int64_t half = rows_ / 2;
      parts_.resize(2, Part{ops_, {}, {}});
      for (int i : {a.q, a.grad_out, a.out, a.lse}) {
        if (i < 0) continue;
        parts_[0].ops[i] = SliceRows(b_, operands[i], kSeq, 0, half);
        b_.program().MarkView(parts_[0].ops[i].value.node.get());
        parts_[1].ops[i] = Swapped(SliceRows(b_, operands[i], kSeq, half, half));
      }
      parts_[0].rows = OwnHalfPositions(half, 0);
      parts_[1].rows = MirroredHalfPositions(half, 0);
    } else {
      parts_.push_back(Part{ops_, {}, {}});
      if (a.causal) parts_[0].rows = TilePositions(b_, axes_, rows_, 0, /*column=*/false);
    }
    if (a.causal)
      for (Part& p : parts_) p.rows_column = Unsqueezed(b, p.rows);
  }

  std::vector<LocalValue> Forward() {
    const TensorType& out_global = b_.node().output(0);
    const TensorType& lse_global = b_.node().output(1);
    const Sharding out_layout = b_.result_layout(0), lse_layout = b_.result_layout(1);
    const DType acc = lse_global.dtype;
    LocalValue k = ops_[a_.k], v = ops_[a_.v];
    std::vector<LocalValue> o(parts_.size()), lse(parts_.size());
    for (int64_t t = 0; t < n_; ++t) {
      b_.BeginCostStep(Share(t), 'k');
      LocalValue k_next, v_next;
      if (t + 1 < n_) {
        k_next = RingPermute(b_, k, axes_, /*to_next=*/false);
        v_next = RingPermute(b_, v, axes_, false);
      }
      for (size_t p = 0; p < parts_.size(); ++p) {
        const std::vector<TensorType> outs = {Rows(out_global, out_layout, p),
                                              Rows(lse_global, lse_layout, p)};
        std::vector<LocalValue> r = Kernel(t, parts_[p], k, v, outs, {out_layout, lse_layout},
                                           {out_global, lse_global});
        if (t == 0) {  // every row sees a key of its own tile
          o[p] = In(r[0], acc);
          lse[p] = r[1];
        } else {
          Merge(t, parts_[p], r[0], r[1], o[p], lse[p]);
        }
      }
      k = k_next;
      v = v_next;
    }
    for (LocalValue& x : o) x = In(x, out_global.dtype);
    return {Joined(o), Joined(lse)};
  }

  std::vector<LocalValue> Backward() {
    const ir::Node& node = b_.node();
    LocalValue k = ops_[a_.k], v = ops_[a_.v];
    const Sharding q_layout = b_.result_layout(0);
    const std::vector<Sharding> layouts = {q_layout, k.layout, v.layout};
    const std::vector<TensorType> globals = {node.output(0), node.output(1), node.output(2)};
    // The sums in lse's dtype (fp32 for 16-bit operands, as PyTorch's ring attention keeps
    // them): a tile's gradient adds 2n parts.
    const DType acc = ops_[a_.lse].value.type().dtype;
    std::vector<LocalValue> dq(parts_.size());
    LocalValue dk, dv;  // the running sums of the tile received last
    for (int64_t t = 0; t < n_; ++t) {
      LocalValue k_next, v_next;
      for (size_t p = 0; p < parts_.size(); ++p) {
        b_.BeginCostStep(Share(t) / static_cast<double>(parts_.size()), 'k');
        if (p == 0 && t + 1 < n_) {
          k_next = RingPermute(b_, k, axes_, false);
          v_next = RingPermute(b_, v, axes_, false);
        }
        const std::vector<TensorType> outs = {Rows(globals[0], q_layout, p),
                                              Local(globals[1], k.layout),
                                              Local(globals[2], v.layout)};
        std::vector<LocalValue> g = Kernel(t, parts_[p], k, v, outs, layouts, globals);
        // Each kernel's gradients join the sums at once (two kernels' would hold both).
        if (t > 0 && p == 0) b_.BeginCostStep(0.0, 'k');  // they wait for the sums' permutes
        dq[p] = t == 0 ? In(g[0], acc) : Accumulate(dq[p], g[0]);
        const bool first = t == 0 && p == 0;
        dk = first ? In(g[1], acc) : Accumulate(dk, g[1]);
        dv = first ? In(g[2], acc) : Accumulate(dv, g[2]);
      }
      // Tile j's sums go where tile j goes next; after the last step, home.
      dk = RingPermute(b_, dk, axes_, false);
      dv = RingPermute(b_, dv, axes_, false);
      k = k_next;
      v = v_next;
    }
    for (LocalValue& x : dq) x = In(x, globals[0].dtype);
    return {Joined(dq), Unbalance(In(dk, globals[1].dtype)), Unbalance(In(dv, globals[2].dtype))};
  }

 private:
  // The operands of one kernel per step: the queries' rows of a part (a balanced tile's two
  // halves run as two kernels, so that the tiles of q, out, grad_out and lse are never copied
  // whole into the balanced order: its own half is a view) and their global positions.
  struct Part {
    std::vector<LocalValue> ops;
    LocalValue rows, rows_column;  // causal: [rows] and [rows, 1] positions
  };

  static TensorType Local(const TensorType& global, const Sharding& layout) {
    return TensorType{global.dtype, LocalShape(global.shape, layout)};
  }
  // The local type of part p's rows of a query-side result.
  TensorType Rows(const TensorType& global, const Sharding& layout, size_t p) const {
    TensorType t = Local(global, layout);
    t.shape[kSeq] = parts_[p].ops[a_.q].local_shape()[kSeq];
    return t;
  }

  // Of the op's cost (its rule's count, a causal one about half the pairs), the share of step
  // t: 1 / n each, balanced or not causal; in sequence order, the diagonal block's causal part,
  // then a whole block per step (the member that sees a whole block sets the pace).
  double Share(int64_t t) const {
    if (!a_.causal || balanced_) return 1.0 / static_cast<double>(n_);
    const double blocks = static_cast<double>(n_) * CausalFraction(a_.L, a_.S);
    return (t == 0 ? CausalFraction(rows_, cols_) : 1.0) / blocks;
  }

  LocalValue In(const LocalValue& x, DType dtype) {
    return x.value.type().dtype == dtype ? x : CastTo(b_, x, dtype);
  }
  // sum + part, written over the running sum (in the sum's dtype).
  LocalValue Accumulate(const LocalValue& sum, const LocalValue& part) {
    const LocalValue r = Binary(b_, "aten::add.Tensor", sum, part);
    b_.program().MarkInPlace(r.value.node.get(), 0);
    return r;
  }

  // The load-balanced order and back (the same swap): the second half of the sequence tile of
  // member i and that of member n - 1 - i trade places.
  LocalValue Swapped(const LocalValue& half) {
    std::vector<int64_t> pairs;
    for (int64_t m = 0; m < n_; ++m) pairs.insert(pairs.end(), {m, n_ - 1 - m});
    return PermuteTiles(b_, half, axes_, pairs);
  }
  LocalValue Balance(const LocalValue& x) {
    const int64_t half = x.local_shape()[kSeq] / 2;
    const LocalValue moved = Swapped(SliceRows(b_, x, kSeq, half, half));
    return Concat(b_, {SliceRows(b_, x, kSeq, 0, half), moved}, kSeq);
  }
  LocalValue Unbalance(const LocalValue& x) { return balanced_ ? Balance(x) : x; }
  // The parts' rows of a query-side result, back in sequence order.
  LocalValue Joined(const std::vector<LocalValue>& parts) {
    return balanced_ ? Concat(b_, {parts[0], Swapped(parts[1])}, kSeq) : parts[0];
  }

  // The global positions of the `half` rows of each half of member (i + shift) mod n's
  // balanced tile, m = (i + shift) mod n: its own, m * tile + [0, half), and the one swapped
  // in, (n - 1 - m) * tile + half + [0, half).
  LocalValue OwnHalfPositions(int64_t half, int64_t shift) {
    return Binary(b_, "aten::add.Tensor", Range(b_, 0, half, 1),
                  TileTable(b_, axes_, 0, 2 * half, shift));
  }
  LocalValue MirroredHalfPositions(int64_t half, int64_t shift) {
    return Binary(b_, "aten::add.Tensor", Range(b_, 0, half, 1),
                  TileTable(b_, axes_, (n_ - 1) * 2 * half + half, -2 * half, shift));
  }
  // The positions of the key/value tile of member (i + t) mod n that member i holds at step t.
  LocalValue KeyPositions(int64_t t) {
    if (!balanced_) return TilePositions(b_, axes_, cols_, t, /*column=*/false);
    return Concat(b_, {OwnHalfPositions(cols_ / 2, t), MirroredHalfPositions(cols_ / 2, t)}, 0);
  }

  // The kernel on a part's queries and key/value tile (i + t) mod n.
  std::vector<LocalValue> Kernel(int64_t t, const Part& part, const LocalValue& k,
                                 const LocalValue& v, const std::vector<TensorType>& outs,
                                 const std::vector<Sharding>& layouts,
                                 const std::vector<TensorType>& globals) {
    std::vector<ir::Value> inputs;
    for (const LocalValue& x : part.ops) inputs.push_back(x.value);
    inputs[a_.k] = k.value;
    inputs[a_.v] = v.value;
    if (!a_.causal || (t == 0 && !balanced_))  // (a diagonal block in order: top-left causal)
      return EmitAttention(b_, a_, std::move(inputs), a_.causal, nullptr, outs, layouts, globals);
    const LocalValue mask = CausalMask(b_, part.rows_column, KeyPositions(t),
                                       ops_[a_.q].value.type().dtype);
    return EmitAttention(b_, a_, std::move(inputs), false, &mask, outs, layouts, globals);
  }

  // The online softmax's step: (o, lse) and block t's (o_t, lse_t) into the running pair,
  // as o + w_t (o_t - o) with w_t = exp(lse_t - lse') (the two weights add up to 1).
  void Merge(int64_t t, const Part& part, const LocalValue& o_t, const LocalValue& lse_t,
             LocalValue& o, LocalValue& lse) {
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
          b_.EmitOp("aten::min", self, {KeyPositions(t).value}, {Arg::Tensor(0)}, scalar,
                    Sharding::Replicated(b_.program().mesh(), 0), scalar);
      merged = Where(b_, AtLeast(b_, part.rows_column, first_key), merged, o);
      merged_lse = Where(b_, AtLeast(b_, part.rows, first_key), merged_lse, lse);
      b_.program().MarkInPlace(merged.value.node.get(), 1);
    }
    o = merged;
    lse = merged_lse;
  }

  LocalBuilder& b_;
  const AttentionNode& a_;
  std::vector<LocalValue> ops_;  // the operands, k and v in the load-balanced order if balanced_
  const AxisList& axes_;
  const int64_t n_, rows_, cols_;
  const bool balanced_;
  std::vector<Part> parts_;
};

}  // namespace

std::vector<LocalValue> LowerRingAttention(LocalBuilder& b, const AttentionNode& a,
                                           const std::vector<LocalValue>& operands,
                                           const AxisList& ring) {
  Ring r(b, a, operands, ring);
  return a.backward ? r.Backward() : r.Forward();
}

}  // namespace spmd::partition
