// The spmd:: ops: graph parameters, user sharding constraints, and the collectives and
// device-dependent helpers that the partitioner inserts. The runtime executes them natively.
//
// Conventions for the partitioner-inserted ops (all are per-device, in a partitioned program):
// - `axes` lists mesh axis indices. The devices taking part with a given device are its group
//   DeviceGroups(mesh, axes); member i of a group holds tile i of a dim tiled by `axes` (first
//   axis most major). The mesh is that of the node's shardings()[0] (the output layout).
// - Uneven tiling: a tensor extent G tiled k ways gives shards of ceil(G/k) (the padded size);
//   tile i is valid on [0, len_i) with len_i = min((i+1)s, G) - min(is, G); the rest is padding
//   whose contents are unspecified unless an op says otherwise.
//
//   all_gather(x; dim, axes, size)       members' tiles of an extent-`size` dim, concatenated
//                                        without their padding: the output extent is `size`.
//   all_reduce(x; axes, op)              elementwise reduction (op: ReduceOp) over the group.
//   reduce_scatter(x; dim, axes, op, size)  x has extent `size` on dim; reduce over the group,
//                                        then keep this member's tile (padded with zeros).
//   all_to_all(x; split_dim, concat_dim, axes, split_size, concat_size)
//                                        x is a tile (over `axes`) of an extent-`concat_size`
//                                        dim and holds the whole extent-`split_size` dim; the
//                                        result holds the whole concat dim and a tile of the
//                                        split dim (padded). Moves axes from one dim to another.
//   collective_permute(x; axes, pairs)   pairs = [src0, dst0, src1, dst1, ...] in group-member
//                                        indices: member dst receives src's buffer; a member
//                                        that receives nothing gets zeros.
//   shard_slice(x; dim, axes, size)      x holds the whole extent-`size` dim (the same on every
//                                        group member): keep this member's tile, zero-padded.
//                                        No communication.
//   ring_slice(x; dim, axes, size, shift, parts, part)
//                                        x holds the whole extent-`size` dim (divisible by
//                                        k parts): piece `part` of `parts` of tile
//                                        (i + shift) mod k, for member i of k: the operand a
//                                        windowed einsum's step multiplies
//                                        (partition/windowed_einsum.h). No communication.
//   ring_unroll(x; dim, axes, size)      x holds the whole extent-`size` dim (divisible by k)
//                                        in ring order: its tile t is tile (i + t) mod k. The
//                                        result holds it in order (x rolled by i tiles). No
//                                        communication.
//   mask_pad(x; dim, axes, size, value)  x is a tile of an extent-`size` dim: write `value` to
//                                        its padding, so a reduction reading it is unaffected.
//   full_to_shard(x)                     manual sharding (PyTorch/XLA's SPMDFullToShardShape):
//                                        x laid out as shardings()[0]; the result is each
//                                        device's padded shard as a tensor of its own ({manual}).
//                                        Lowered to nothing: the shard is the buffer.
//   shard_to_full(x)                     the inverse: the devices' manual buffers are the
//                                        shards of a shardings()[0]-laid-out full tensor.
//   offload(x; to_host)                  the user's annotation (torch_spmd.memory.offload,
//                                        save_on_cpu): x, which its readers in the backward
//                                        read from host memory when `to_host` (1; 0: a plain
//                                        identity, a checkpoint name to save). Rewritten into
//                                        the two below before partitioning
//                                        (partition/offload.h).
//   place_to_host(x)                     x copied to the host memory of its device's host: the
//                                        result holds no device memory. No communication
//                                        between devices: a transfer over the host link.
//   place_to_device(x)                   the inverse: a value in host memory copied back.
//   halo_exchange(x; dim, axes, left, right, value)
//                                        x is an even tile: output = [the previous member's last
//                                        `left` rows | x | the next member's first `right` rows],
//                                        `value` where there is no neighbour (ends of the dim).
#pragma once
#include "ir/op.h"

namespace spmd::ir {

struct InternalOps {
  const OpInfo* device_data;          // graph parameter; node->data() holds the buffers
  const OpInfo* sharding_constraint;  // identity; shardings()[0] is the user's annotation
  const OpInfo* all_gather;
  const OpInfo* all_reduce;
  const OpInfo* reduce_scatter;
  const OpInfo* all_to_all;
  const OpInfo* collective_permute;
  const OpInfo* shard_slice;
  const OpInfo* ring_slice;
  const OpInfo* ring_unroll;
  const OpInfo* mask_pad;
  const OpInfo* halo_exchange;
  const OpInfo* offload;
  const OpInfo* place_to_host;
  const OpInfo* place_to_device;
  const OpInfo* full_to_shard;
  const OpInfo* shard_to_full;
  static const InternalOps& Get();
};

}  // namespace spmd::ir
