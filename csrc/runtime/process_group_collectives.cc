#include "runtime/process_group_collectives.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <deque>

#include "core/error.h"
#include "core/metrics.h"
#include "runtime/error_message.h"
#include "runtime/process_span.h"
#include "runtime/tile_ops.h"
#include "runtime/world_health.h"

namespace spmd::runtime {

namespace {

// Point-to-point messages of one collective_permute: each receiver has one source, so one tag
// is enough (gloo matches messages per (peer, tag) in order).
constexpr int kPermuteTag = 0x5e4d;

// The dtype a tensor travels as: gloo implements no bfloat16, bool or int16 arithmetic.
at::ScalarType WireType(at::ScalarType t) {
  switch (t) {
    case at::kBFloat16: return at::kFloat;
    case at::kBool: return at::kByte;
    case at::kShort: return at::kInt;
    default: return t;
  }
}

// A fresh, contiguous wire-dtype copy: gloo writes into its buffers, and device values are
// immutable.
at::Tensor FreshWire(const at::Tensor& t) {
  return t.to(WireType(t.scalar_type()), /*non_blocking=*/false, /*copy=*/true)
      .contiguous();
}

// A contiguous wire-dtype tensor that gloo only reads (no copy when already suitable).
at::Tensor ReadWire(const at::Tensor& t) {
  return t.to(WireType(t.scalar_type())).contiguous();
}

c10d::ReduceOp ToC10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return c10d::ReduceOp::SUM;
    case ReduceOp::kMax: return c10d::ReduceOp::MAX;
    case ReduceOp::kMin: return c10d::ReduceOp::MIN;
  }
  SPMD_FAIL("unknown ReduceOp ", static_cast<int>(op));
}

// (World failures: runtime/world_health.h.)
void Wait(const c10::intrusive_ptr<c10d::Work>& work, const char* what) {
  WorldHealth::Wait(work, what);
}

// ProcessGroup's all-to-all of one tensor: all_to_all_single where torch has it (alltoall_base
// is deprecated there), alltoall_base on older torches (2.6).
template <typename Group>
c10::intrusive_ptr<c10d::Work> AllToAllSingle(Group& pg, at::Tensor& recv, at::Tensor& send,
                                              std::vector<int64_t>& splits) {
  if constexpr (requires { pg.all_to_all_single(recv, send, splits, splits); })
    return pg.all_to_all_single(recv, send, splits, splits);
  else
    return pg.alltoall_base(recv, send, splits, splits);
}

}  // namespace

ProcessGroupCollectives::ProcessGroupCollectives(ProcessGroupPtr world)
    : world_(std::move(world)) {
  SPMD_CHECK_VALUE(world_, "ProcessGroupCollectives needs a process group");
  rank_ = world_->getRank();
  world_size_ = world_->getSize();
}

void ProcessGroupCollectives::AddGroup(std::vector<int64_t> ranks, ProcessGroupPtr group) {
  std::sort(ranks.begin(), ranks.end());
  SPMD_CHECK_VALUE(group && group->getSize() == static_cast<int>(ranks.size()),
                   "AddGroup: the process group must have one rank per listed rank");
  auto me = std::find(ranks.begin(), ranks.end(), rank_);
  SPMD_CHECK_VALUE(me != ranks.end(), "AddGroup: rank ", rank_, " is not in the group");
  SPMD_CHECK_VALUE(group->getRank() == me - ranks.begin(), "AddGroup: the process group ranks ",
                   "its members out of ascending order (rank ", rank_, " is its rank ",
                   group->getRank(), ")");
  std::lock_guard<std::mutex> lock(mu_);
  groups_[std::move(ranks)] = std::move(group);
}

bool ProcessGroupCollectives::HasGroup(std::vector<int64_t> ranks) const {
  std::sort(ranks.begin(), ranks.end());
  std::lock_guard<std::mutex> lock(mu_);
  return groups_.count(ranks) > 0;
}

ProcessGroupCollectives::Comm ProcessGroupCollectives::CommFor(const MeshGroups& groups) const {
  Comm c;
  c.members = groups.GroupOf(rank_);
  c.index = groups.IndexOf(rank_);
  std::vector<int64_t> sorted = c.members;
  std::sort(sorted.begin(), sorted.end());
  SPMD_CHECK_VALUE(sorted.back() < world_size_, "collective over rank ", sorted.back(),
                   " but the process world has ", world_size_, " ranks");
  if (sorted.size() == 1 || static_cast<int64_t>(sorted.size()) == world_size_) {
    c.pg = world_;  // (a group of one never communicates)
    for (int64_t m : c.members) c.pg_rank.push_back(static_cast<int>(m));
    return c;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = groups_.find(sorted);
    SPMD_CHECK(it != groups_.end(), "no process group for the ranks ", c10::IntArrayRef(sorted),
               " of rank ", rank_, "'s collective group; it is created when an xm collective ",
               "with those groups is recorded");
    c.pg = it->second;
  }
  for (int64_t m : c.members)
    c.pg_rank.push_back(static_cast<int>(std::lower_bound(sorted.begin(), sorted.end(), m) -
                                         sorted.begin()));
  return c;
}

std::vector<at::Tensor> ProcessGroupCollectives::Exchange(
    const Comm& c, const std::vector<at::Tensor>& chunks) const {
  const size_t k = c.members.size();
  std::vector<at::Tensor> by_pg_rank(k);
  for (size_t m = 0; m < k; ++m) by_pg_rank[c.pg_rank[m]] = chunks[m];
  at::Tensor send = at::stack(by_pg_rank, 0);
  at::Tensor recv = at::empty_like(send, at::MemoryFormat::Contiguous);
  std::vector<int64_t> equal_splits;
  Wait(AllToAllSingle(*c.pg, recv, send, equal_splits), "all-to-all");
  std::vector<at::Tensor> got(k);
  for (size_t m = 0; m < k; ++m) got[m] = recv.select(0, c.pg_rank[m]);
  return got;
}

DeviceTensors ProcessGroupCollectives::DoAllReduce(const DeviceTensors& in,
                                                   const MeshGroups& groups, ReduceOp op) {
  Comm c = CommFor(groups);
  const at::Tensor& x = in[rank_];
  DeviceTensors out(in.size());
  if (c.members.size() == 1) {
    out[rank_] = x;  // values are immutable: a group of one shares its input
    return out;
  }
  std::vector<at::Tensor> bufs{FreshWire(x)};
  c10d::AllreduceOptions options;
  options.reduceOp = ToC10d(op);
  Wait(c.pg->allreduce(bufs, options), "all-reduce");
  out[rank_] = bufs[0].to(x.scalar_type());
  return out;
}

DeviceTensors ProcessGroupCollectives::DoAllGather(const DeviceTensors& in,
                                                   const MeshGroups& groups, int64_t dim,
                                                   int64_t size) {
  Comm c = CommFor(groups);
  const at::Tensor& x = in[rank_];
  const int64_t k = static_cast<int64_t>(c.members.size());
  const DimTiling tiling(size, k);
  DeviceTensors out(in.size());
  if (k == 1) {
    out[rank_] = ValidRows(x, dim, tiling, 0);
    return out;
  }
  std::vector<at::Tensor> inputs{ReadWire(x)};
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int64_t r = 0; r < k; ++r) outputs[0].push_back(at::empty_like(inputs[0]));
  Wait(c.pg->allgather(outputs, inputs), "all-gather");
  std::vector<at::Tensor> parts;
  for (int64_t m = 0; m < k; ++m)
    parts.push_back(ValidRows(outputs[0][c.pg_rank[m]], dim, tiling, m));
  out[rank_] = at::cat(parts, dim).to(x.scalar_type());
  return out;
}

DeviceTensors ProcessGroupCollectives::DoReduceScatter(const DeviceTensors& in,
                                                       const MeshGroups& groups, int64_t dim,
                                                       ReduceOp op, int64_t size) {
  Comm c = CommFor(groups);
  const at::Tensor& x = in[rank_];
  const int64_t k = static_cast<int64_t>(c.members.size());
  const DimTiling tiling(size, k);
  DeviceTensors out(in.size());
  if (k == 1) {
    out[rank_] = PaddedTile(x, dim, tiling, 0);
    return out;
  }
  // Member m gets everyone's tile m; each then reduces the k tiles it received, in member
  // order (the order the in-process implementation uses, so results match bit for bit).
  std::vector<at::Tensor> chunks;
  for (int64_t m = 0; m < k; ++m) chunks.push_back(ReadWire(PaddedTile(x, dim, tiling, m)));
  std::vector<at::Tensor> got = Exchange(c, chunks);
  at::Tensor acc = got[0].clone(at::MemoryFormat::Contiguous);
  for (int64_t m = 1; m < k; ++m) ReduceInto(acc, got[m], op);
  out[rank_] = acc.to(x.scalar_type());
  return out;
}

DeviceTensors ProcessGroupCollectives::DoAllToAll(const DeviceTensors& in,
                                                  const MeshGroups& groups, int64_t split_dim,
                                                  int64_t concat_dim, int64_t split_size,
                                                  int64_t concat_size) {
  Comm c = CommFor(groups);
  const at::Tensor& x = in[rank_];
  const int64_t k = static_cast<int64_t>(c.members.size());
  const DimTiling split(split_size, k), concat(concat_size, k);
  // Member m gets tile m of the split dim (zero-padded); what arrives from member m is its
  // tile of the concat dim, whose valid rows are concatenated in member order.
  std::vector<at::Tensor> chunks;
  for (int64_t m = 0; m < k; ++m) chunks.push_back(ReadWire(PaddedTile(x, split_dim, split, m)));
  std::vector<at::Tensor> got =
      k == 1 ? std::vector<at::Tensor>{chunks[0]} : Exchange(c, chunks);
  std::vector<at::Tensor> parts;
  for (int64_t m = 0; m < k; ++m) parts.push_back(ValidRows(got[m], concat_dim, concat, m));
  DeviceTensors out(in.size());
  out[rank_] = at::cat(parts, concat_dim).to(x.scalar_type());
  return out;
}

DeviceTensors ProcessGroupCollectives::DoCollectivePermute(const DeviceTensors& in,
                                                           const MeshGroups& groups,
                                                           const PermutePairs& pairs) {
  Comm c = CommFor(groups);
  const at::Tensor& x = in[rank_];
  at::Tensor wire = ReadWire(x);
  at::Tensor received;
  std::deque<std::vector<at::Tensor>> buffers;  // stable addresses while the work runs
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  for (const auto& [src, dst] : pairs) {
    if (src == c.index && dst == c.index) {
      received = x;
    } else if (src == c.index) {
      buffers.push_back({wire});
      works.push_back(c.pg->send(buffers.back(), c.pg_rank[dst], kPermuteTag));
    } else if (dst == c.index) {
      buffers.push_back({at::empty_like(wire)});
      received = buffers.back()[0];
      works.push_back(c.pg->recv(buffers.back(), c.pg_rank[src], kPermuteTag));
    }
  }
  for (const auto& w : works) Wait(w, "collective-permute");
  DeviceTensors out(in.size());
  out[rank_] = received.defined() ? received.to(x.scalar_type())
                                  : at::zeros_like(x, at::MemoryFormat::Contiguous);
  return out;
}

namespace {

// The span's exchanges over the world group: an all-gather of equally shaped tensors.
class ProcessGroupSpan final : public ProcessSpan {
 public:
  ProcessGroupSpan(ProcessGroupCollectives::ProcessGroupPtr world, int64_t local_devices)
      : ProcessSpan(world->getRank(), world->getSize(), local_devices), world_(std::move(world)) {}

  at::Tensor AllGather(const at::Tensor& local, const char* what) override {
    ScopedTimer timer("CrossProcessTime");  // waiting included: what the step spends on it
    std::vector<at::Tensor> inputs{ReadWire(local)};
    std::vector<std::vector<at::Tensor>> outputs(1);
    for (int64_t p = 0; p < process_count(); ++p) outputs[0].push_back(at::empty_like(inputs[0]));
    Wait(world_->allgather(outputs, inputs), what);
    NoteSent(inputs[0].numel() * static_cast<int64_t>(inputs[0].element_size()) *
             (process_count() - 1));
    return at::cat(outputs[0], 0).to(local.scalar_type());
  }

 protected:
  void SendBytes(const at::Tensor& bytes, int64_t to, const char* what) override {
    ScopedTimer timer("CrossProcessTime");
    std::vector<at::Tensor> buffers{bytes};
    Wait(world_->send(buffers, static_cast<int>(to), kChainTag), what);
  }
  void RecvBytes(at::Tensor& bytes, int64_t from, const char* what) override {
    ScopedTimer timer("CrossProcessTime");
    std::vector<at::Tensor> buffers{bytes};
    Wait(world_->recv(buffers, static_cast<int>(from), kChainTag), what);
  }
  void BroadcastBytes(at::Tensor& bytes, int64_t root, const char* what) override {
    ScopedTimer timer("CrossProcessTime");
    std::vector<at::Tensor> buffers{bytes};
    c10d::BroadcastOptions options;
    options.rootRank = root;
    Wait(world_->broadcast(buffers, options), what);
  }

 private:
  // The chained reductions' messages (span_kernels.h): one per hop, in order.
  static constexpr int kChainTag = 0x5e4e;
  ProcessGroupCollectives::ProcessGroupPtr world_;
};

}  // namespace

std::shared_ptr<ProcessSpan> MakeProcessGroupSpan(ProcessGroupCollectives::ProcessGroupPtr world,
                                                  int64_t local_devices) {
  SPMD_CHECK_VALUE(world, "a process span needs a process group");
  return std::make_shared<ProcessGroupSpan>(std::move(world), local_devices);
}

}  // namespace spmd::runtime
