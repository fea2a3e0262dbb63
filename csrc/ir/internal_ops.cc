#include "ir/internal_ops.h"

namespace spmd::ir {

namespace {
ArgSchema Tensor(const char* name) { return {name, ArgType::kTensor}; }
ArgSchema Int(const char* name) { return {name, ArgType::kInt}; }
ArgSchema Ints(const char* name) { return {name, ArgType::kIntList}; }
ArgSchema Float(const char* name) { return {name, ArgType::kFloat}; }
}  // namespace

const InternalOps& InternalOps::Get() {
  static const InternalOps* ops = [] {
    auto* o = new InternalOps();
    o->device_data = InternOp("spmd::device_data", {}, 1, /*internal=*/true);
    o->sharding_constraint = InternOp("spmd::sharding_constraint", {Tensor("self")}, 1, true);
    o->all_gather =
        InternOp("spmd::all_gather", {Tensor("self"), Int("dim"), Ints("axes"), Int("size")}, 1, true);
    o->all_reduce = InternOp("spmd::all_reduce", {Tensor("self"), Ints("axes"), Int("op")}, 1, true);
    o->reduce_scatter = InternOp(
        "spmd::reduce_scatter",
        {Tensor("self"), Int("dim"), Ints("axes"), Int("op"), Int("size")}, 1, true);
    o->all_to_all = InternOp("spmd::all_to_all",
                             {Tensor("self"), Int("split_dim"), Int("concat_dim"), Ints("axes"),
                              Int("split_size"), Int("concat_size")},
                             1, true);
    o->collective_permute =
        InternOp("spmd::collective_permute", {Tensor("self"), Ints("axes"), Ints("pairs")}, 1, true);
    o->shard_slice =
        InternOp("spmd::shard_slice", {Tensor("self"), Int("dim"), Ints("axes"), Int("size")}, 1, true);
    o->ring_slice = InternOp("spmd::ring_slice",
                             {Tensor("self"), Int("dim"), Ints("axes"), Int("size"), Int("shift"),
                              Int("parts"), Int("part")},
                             1, true);
    o->ring_unroll =
        InternOp("spmd::ring_unroll", {Tensor("self"), Int("dim"), Ints("axes"), Int("size")}, 1, true);
    o->mask_pad = InternOp("spmd::mask_pad",
                           {Tensor("self"), Int("dim"), Ints("axes"), Int("size"), Float("value")},
                           1, true);
    o->halo_exchange = InternOp("spmd::halo_exchange",
                                {Tensor("self"), Int("dim"), Ints("axes"), Int("left"),
                                 Int("right"), Float("value")},
                                1, true);
    o->offload = InternOp("spmd::offload", {Tensor("self"), Int("to_host")}, 1, true);
    o->place_to_host = InternOp("spmd::place_to_host", {Tensor("self")}, 1, true);
    o->place_to_device = InternOp("spmd::place_to_device", {Tensor("self")}, 1, true);
    o->full_to_shard = InternOp("spmd::full_to_shard", {Tensor("self")}, 1, true);
    o->shard_to_full = InternOp("spmd::shard_to_full", {Tensor("self")}, 1, true);
    return o;
  }();
  return *ops;
}

}  // namespace spmd::ir
