// Ops that move rows along dims which may stay sharded: torch.roll and torch.flip. Sharded,
// they move whole slices of tiles between devices with collective-permutes, as GSPMD does for
// a pipeline's shifting buffer (GSPMD paper §3.3), instead of gathering the dim.
//
// A moved dim is a windowed factor (rule.h): a result tile reads rows of other tiles, and the
// factor is cut only into tiles that divide the dim evenly, so that every device sends and
// receives the same rows (an uneven dim stays whole and is gathered). On a dim of n = k tiles
// of T rows:
//
//   roll(x, s):  with s mod n = q T + r, result tile j = [the last r rows of tile j-q-1 |
//                the first T-r rows of tile j-q] (tiles mod k): two collective-permutes of
//                r and T-r rows (one when r = 0, none when the tiles stay put).
//   flip(x):     result tile j = tile k-1-j flipped: one collective-permute of a tile.
//
// Unsharded dims roll or flip locally, in one op.
#include <algorithm>

#include "partition/halo.h"
#include "partition/local_builder.h"
#include "partition/rules/all_rules.h"
#include "partition/rules/rule.h"

namespace spmd::partition {

namespace {

using ir::Arg;
using ir::ArgType;

enum class Move { kRoll, kFlip };

// The local op over `dims` (with `shifts` for a roll); x itself when there is none.
LocalValue LocalMove(LocalBuilder& b, const LocalValue& x, Move move,
                     const std::vector<int64_t>& dims, const std::vector<int64_t>& shifts) {
  if (dims.empty()) return x;
  if (move == Move::kFlip) {
    static const std::vector<ir::ArgSchema> schema = {{"self", ArgType::kTensor},
                                                      {"dims", ArgType::kIntList}};
    return b.EmitOp("aten::flip", schema, {x.value}, {Arg::Tensor(0), Arg::IntList(dims)},
                    x.value.type(), x.layout, x.global);
  }
  static const std::vector<ir::ArgSchema> schema = {
      {"self", ArgType::kTensor}, {"shifts", ArgType::kIntList}, {"dims", ArgType::kIntList}};
  return b.EmitOp("aten::roll", schema, {x.value},
                  {Arg::Tensor(0), Arg::IntList(shifts), Arg::IntList(dims)}, x.value.type(),
                  x.layout, x.global);
}

// roll by `s` of dim d, tiled evenly over `axes` (see the top of the file).
LocalValue RollTiled(LocalBuilder& b, const LocalValue& x, int64_t d, int64_t s,
                     const AxisList& axes) {
  const int64_t n = x.global.shape[d], rows = x.value.type().shape[d];
  s = ((s % n) + n) % n;
  const int64_t q = s / rows, r = s % rows;
  LocalValue head = RotateTiles(b, SliceRows(b, x, d, 0, rows - r), axes, q);
  if (r == 0) return head;
  LocalValue tail = RotateTiles(b, SliceRows(b, x, d, rows - r, r), axes, q + 1);
  return Concat(b, {tail, head}, d);
}

// flip of dim d (already flipped within each tile), tiled over `axes`: tile j goes to k-1-j.
LocalValue FlipTiles(LocalBuilder& b, const LocalValue& x, const AxisList& axes) {
  const int64_t k = AxesSize(b.mesh(), axes);
  std::vector<int64_t> pairs;
  for (int64_t i = 0; i < k; ++i) pairs.insert(pairs.end(), {i, k - 1 - i});
  return PermuteTiles(b, x, axes, std::move(pairs));
}

std::optional<ShardingRule> MoveRows(const ir::Node& node, Move move) {
  const TensorType& in = node.input(0).type();
  if (in.rank() == 0 || node.output(0).shape != in.shape) return std::nullopt;
  std::vector<int64_t> dims = IntListArg(node, ArgIndex(node, "dims"));
  std::vector<int64_t> shifts;
  if (move == Move::kRoll) {
    shifts = IntListArg(node, ArgIndex(node, "shifts"));
    // roll without dims rolls the flattened tensor: every dim moves rows across the others.
    if (dims.empty() || shifts.size() != dims.size()) return std::nullopt;
  }
  for (int64_t& d : dims) d = WrapDim(d, in.rank());
  ShardingRule rule;
  rule.executor.reads_extents = false;  // the other dims are independent
  rule.algebra.linear_operands = {true};
  TensorFactors fs = PassThroughFactors(rule, in);
  rule.operands = {fs};
  rule.results = {fs};
  std::vector<int> moved;  // the factor of each of `dims`
  for (int64_t d : dims) {
    Factor& f = rule.factors[fs[d][0]];
    f.windowed = true;
    f.couples_tiles = true;
    moved.push_back(fs[d][0]);
  }
  rule.lowering.lower = [move, dims, shifts, moved](LocalBuilder& b, const std::vector<LocalValue>& ops) {
    // Unsharded dims (and, for flip, every dim's rows within its tile) move locally first.
    std::vector<int64_t> local_dims, local_shifts;
    for (size_t i = 0; i < dims.size(); ++i) {
      if (move == Move::kFlip || b.factor_axes()[moved[i]].empty()) {
        local_dims.push_back(dims[i]);
        if (move == Move::kRoll) local_shifts.push_back(shifts[i]);
      }
    }
    LocalValue x = LocalMove(b, ops[0], move, local_dims, local_shifts);
    for (size_t i = 0; i < dims.size(); ++i) {
      const AxisList& axes = b.factor_axes()[moved[i]];
      if (axes.empty()) continue;
      x = move == Move::kRoll ? RollTiled(b, x, dims[i], shifts[i], axes) : FlipTiles(b, x, axes);
    }
    return std::vector<LocalValue>{x};
  };
  return rule;
}

}  // namespace

void RegisterShiftRules() {
  RegisterRule("aten::roll", [](const ir::Node& n) { return MoveRows(n, Move::kRoll); });
  RegisterRule("aten::flip", [](const ir::Node& n) { return MoveRows(n, Move::kFlip); });
}

}  // namespace spmd::partition
