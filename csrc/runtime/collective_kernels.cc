// Runtime kernels of the partitioner-inserted spmd:: ops (ir/internal_ops.h): the collectives
// go through Collectives::Current(); shard_slice, ring_slice, ring_unroll and mask_pad are
// device-local but depend on each device's position in its group; halo_exchange is two
// collective-permutes of edge slices.
#include <ATen/ATen.h>

#include <cmath>
#include <limits>
#include <map>
#include <utility>

#include "core/error.h"
#include "ir/internal_attrs.h"
#include "ir/internal_ops.h"
#include "runtime/collectives.h"
#include "runtime/internal_kernels.h"
#include "runtime/tile_ops.h"

namespace spmd::runtime {

namespace {

// One execution of an spmd op: its attributes, groups and per-device input tensors.
struct Call {
  const ir::Node& node;
  ir::SpmdAttrs attrs;
  MeshGroups groups;
  DeviceTensors in;  // undefined where the device holds no buffer (not owned by this process)
};

Call Prepare(const ir::Node& node, const std::vector<const PerDevice*>& inputs) {
  const std::string& op = node.op()->qualified;
  SPMD_CHECK(!node.shardings().empty() && node.shardings()[0].valid(), op,
             " has no output sharding to take its mesh from");
  SPMD_CHECK(inputs.size() == 1, op, " takes one tensor, got ", inputs.size());
  const Mesh& mesh = node.shardings()[0].mesh();
  const int64_t n = DeviceSet::Get().num_devices();
  SPMD_CHECK(mesh.size() == n, op, ": the mesh has ", mesh.size(), " devices but the device set has ",
             n);
  ir::SpmdAttrs attrs = ir::SpmdAttrs::Read(*node.op(), node.args());
  MeshGroups groups(mesh, attrs.axes);
  const PerDevice& buffers = *inputs[0];
  SPMD_CHECK(static_cast<int64_t>(buffers.size()) == n, op, " got ", buffers.size(),
             " buffers for ", n, " devices");
  DeviceTensors in(n);
  for (int64_t d = 0; d < n; ++d)
    if (buffers[d]) in[d] = buffers[d]->tensor;
  return Call{node, std::move(attrs), std::move(groups), std::move(in)};
}

// Device buffers for the results, each device accounting its own bytes even where several share
// one host tensor. Checks them against the node's declared output type, as the executor does
// for ATen ops, so a partitioner/kernel disagreement fails here rather than downstream.
PerDevice Finish(const Call& c, const DeviceTensors& out) {
  const TensorType& want = c.node.output(0);
  const std::string label = c.node.op()->qualified + " -> " + want.ToString();
  PerDevice result(out.size());
  for (size_t d = 0; d < out.size(); ++d) {
    if (!out[d].defined()) continue;
    SPMD_CHECK(out[d].sizes().vec() == want.shape &&
                   FromScalarType(out[d].scalar_type()) == want.dtype,
               "internal error: ", c.node.op()->qualified, " produced ",
               TypeOf(out[d]).ToString(), " where the program expects ", want.ToString());
    result[d] = MakeBuffer(d, out[d], label);
  }
  return result;
}

// Applies a device-local `fn(tensor, member index)` to every present input. Devices holding the
// same host tensor at the same member index get the same result, computed once and shared.
template <typename Fn>
DeviceTensors MapLocal(const Call& c, Fn fn) {
  DeviceTensors out(c.in.size());
  std::map<std::pair<const void*, int64_t>, at::Tensor> done;
  for (size_t d = 0; d < c.in.size(); ++d) {
    if (!c.in[d].defined()) continue;
    const int64_t index = c.groups.IndexOf(d);
    auto key = std::make_pair(static_cast<const void*>(c.in[d].unsafeGetTensorImpl()), index);
    auto it = done.find(key);
    if (it == done.end()) it = done.emplace(key, fn(c.in[d], index)).first;
    out[d] = it->second;
  }
  return out;
}

void CheckExtent(const Call& c, const at::Tensor& x, int64_t dim, int64_t want) {
  SPMD_CHECK_VALUE(dim >= 0 && dim < x.dim() && x.size(dim) == want, c.node.op()->qualified,
                   ": each device's input must have extent ", want, " on dim ", dim, ", got ",
                   x.sizes());
}

using Kernel = DeviceTensors (*)(const Call&);

DeviceTensors AllGather(const Call& c) {
  return Collectives::Current()->AllGather(c.in, c.groups, c.attrs.dim, c.attrs.size);
}

DeviceTensors AllReduce(const Call& c) {
  return Collectives::Current()->AllReduce(c.in, c.groups, c.attrs.op);
}

DeviceTensors ReduceScatter(const Call& c) {
  return Collectives::Current()->ReduceScatter(c.in, c.groups, c.attrs.dim, c.attrs.op,
                                               c.attrs.size);
}

DeviceTensors AllToAll(const Call& c) {
  const ir::SpmdAttrs& a = c.attrs;
  return Collectives::Current()->AllToAll(c.in, c.groups, a.split_dim, a.concat_dim,
                                          a.split_size, a.concat_size);
}

DeviceTensors CollectivePermute(const Call& c) {
  return Collectives::Current()->CollectivePermute(c.in, c.groups, c.attrs.pairs);
}

DeviceTensors ShardSlice(const Call& c) {
  const DimTiling tiling(c.attrs.size, c.groups.group_size());
  const int64_t dim = c.attrs.dim;
  return MapLocal(c, [&](const at::Tensor& x, int64_t index) {
    CheckExtent(c, x, dim, tiling.extent);
    return PaddedTile(x, dim, tiling, index);
  });
}

// Piece `part` of tile (index + shift) mod k of an even extent: a windowed einsum's operand
// at one step.
DeviceTensors RingSlice(const Call& c) {
  const ir::SpmdAttrs& a = c.attrs;
  const int64_t k = c.groups.group_size(), piece = a.size / (k * a.parts), dim = a.dim;
  return MapLocal(c, [&](const at::Tensor& x, int64_t index) {
    CheckExtent(c, x, dim, a.size);
    const int64_t start = ((index + a.shift) % k * a.parts + a.part) * piece;
    return x.narrow(dim, start, piece).contiguous();
  });
}

// The dim in ring order (tile t is tile index + t) put back in order: rolled by index tiles.
DeviceTensors RingUnroll(const Call& c) {
  const int64_t tile = c.attrs.size / c.groups.group_size(), dim = c.attrs.dim;
  return MapLocal(c, [&](const at::Tensor& x, int64_t index) {
    CheckExtent(c, x, dim, c.attrs.size);
    return index == 0 ? x : at::roll(x, {index * tile}, {dim});
  });
}

DeviceTensors MaskPad(const Call& c) {
  const DimTiling tiling(c.attrs.size, c.groups.group_size());
  const int64_t dim = c.attrs.dim;
  return MapLocal(c, [&](const at::Tensor& x, int64_t index) {
    CheckExtent(c, x, dim, tiling.tile_size);
    const int64_t valid = tiling.Length(index);
    if (valid == tiling.tile_size) return x;  // no padding: the input is already the result
    at::Tensor y = x.clone(at::MemoryFormat::Contiguous);
    y.narrow(dim, valid, tiling.tile_size - valid).fill_(PadValueFor(y, c.attrs.value));
    return y;
  });
}

// Rows [start, start + length) of `dim` of each member i, delivered to member i + shift; a
// member with no such neighbour (an end of the dim) gets `value` instead.
DeviceTensors ExchangeEdge(const Call& c, int64_t start, int64_t length, int64_t shift) {
  const int64_t dim = c.attrs.dim, k = c.groups.group_size();
  DeviceTensors edges(c.in.size());
  for (size_t d = 0; d < c.in.size(); ++d)
    if (c.in[d].defined()) edges[d] = c.in[d].narrow(dim, start, length);
  if (length == 0) return edges;  // nothing to send: empty halos
  PermutePairs pairs;
  for (int64_t i = 0; i < k; ++i)
    if (i + shift >= 0 && i + shift < k) pairs.emplace_back(i, i + shift);
  DeviceTensors got =
      pairs.empty() ? DeviceTensors(c.in.size())
                    : Collectives::Current()->CollectivePermute(edges, c.groups, pairs);
  at::Tensor fill;  // shared by every end member
  for (size_t d = 0; d < c.in.size(); ++d) {
    if (!c.in[d].defined()) continue;
    const int64_t source = c.groups.IndexOf(d) - shift;
    if (source >= 0 && source < k) continue;
    if (!fill.defined()) fill = at::full(edges[d].sizes(), c.attrs.value, edges[d].options());
    got[d] = fill;
  }
  return got;
}

DeviceTensors HaloExchange(const Call& c) {
  const ir::SpmdAttrs& a = c.attrs;
  const at::Tensor* x = nullptr;
  for (const at::Tensor& t : c.in)
    if (t.defined()) x = &t;
  SPMD_CHECK(x != nullptr, "halo_exchange: this process owns no device of the mesh");
  SPMD_CHECK_VALUE(a.dim >= 0 && a.dim < x->dim(), "halo_exchange: dim ", a.dim,
                   " is out of range for a tensor of rank ", x->dim());
  const int64_t tile = x->size(a.dim);
  SPMD_CHECK_VALUE(a.left <= tile && a.right <= tile, "halo_exchange: halos of ", a.left, " and ",
                   a.right, " reach beyond the direct neighbours' tiles of ", tile);
  DeviceTensors left = ExchangeEdge(c, tile - a.left, a.left, +1);  // from the previous member
  DeviceTensors right = ExchangeEdge(c, 0, a.right, -1);            // from the next member
  DeviceTensors out(c.in.size());
  for (size_t d = 0; d < c.in.size(); ++d)
    if (c.in[d].defined()) out[d] = at::cat({left[d], c.in[d], right[d]}, a.dim);
  return out;
}

void Register(const ir::OpInfo* op, Kernel kernel) {
  RegisterInternalKernel(op->qualified, [kernel](const ir::Node& node,
                                                 const std::vector<const PerDevice*>& inputs) {
    Call c = Prepare(node, inputs);
    return std::vector<PerDevice>{Finish(c, kernel(c))};
  });
}

}  // namespace

void RegisterCollectiveKernels() {
  RegisterSpmdOpKernels<Kernel>({AllGather, AllReduce, ReduceScatter, AllToAll,
                                 CollectivePermute, ShardSlice, RingSlice, RingUnroll, MaskPad,
                                 HaloExchange},
                                Register);
}

PerDevice RunSpmdOp(const ir::OpInfo& op, std::vector<ir::Arg> args, MeshPtr mesh,
                    const PerDevice& inputs, bool stacked) {
  const InternalKernel* kernel = FindInternalKernel(op.qualified);
  SPMD_CHECK_VALUE(kernel != nullptr, "no runtime kernel for ", op.qualified);
  SPMD_CHECK_VALUE(!inputs.empty() && inputs[0], op.qualified, " needs device 0's input");
  const TensorType in_type = TypeOf(inputs[0]->tensor);
  const Shape out_shape =
      ir::SpmdOutputShape(op, in_type.shape, ir::SpmdAttrs::Read(op, args), *mesh);
  // The input enters as a parameter holding per-device (manual) values, as in a program.
  auto data = std::make_shared<DeviceData>(in_type, Sharding::Manual(mesh, in_type.rank()), inputs);
  ir::NodePtr node = ir::MakeNode(&op, {ir::Value{ir::MakeDataNode(data), 0}}, std::move(args),
                                  {TensorType{in_type.dtype, out_shape}});
  node->set_shardings({Sharding::Replicated(mesh, static_cast<int64_t>(out_shape.size()))});
  if (!stacked) return (*kernel)(*node, {&data->shards()}).at(0);
  const StackedKernel* stacked_kernel = FindStackedKernel(op.qualified);
  SPMD_CHECK_VALUE(stacked_kernel != nullptr, "no stacked kernel for ", op.qualified);
  for (const BufferPtr& b : inputs) {
    SPMD_CHECK_VALUE(b, op.qualified, ": every device needs an input");
    SPMD_CHECK_VALUE(b->tensor.sizes() == inputs[0]->tensor.sizes() &&
                         b->tensor.scalar_type() == inputs[0]->tensor.scalar_type(),
                     op.qualified, ": every device's input must have one shape and dtype, got ",
                     inputs[0]->tensor.sizes(), " and ", b->tensor.sizes());
  }
  Stacked out = (*stacked_kernel)(*node, {&data->stacked()}).at(0);
  SPMD_CHECK(out.rows.sizes().slice(1).vec() == node->output(0).shape, "internal error: ",
             op.qualified, " produced rows ", out.rows.sizes(), " where the program expects ",
             node->output(0).ToString());
  return BuffersOf(out, InternLabel(op.qualified + " -> " + node->output(0).ToString()));
}

}  // namespace spmd::runtime
