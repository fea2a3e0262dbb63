// Runtime kernels of the xm:: cross-replica collectives (ir/replica_ops.h). Replica r of the
// groups is global device r of Collectives::Replicas(): in multi-process mode that is
// ProcessGroupCollectives, where each process owns one device (its rank). The kernels only
// translate between the op's attributes and the Collectives interface, which does the
// validation, the metrics (Collective<Kind> counters and bytes) and the communication.
#include <ATen/ATen.h>

#include <map>

#include "core/error.h"
#include "ir/replica_ops.h"
#include "runtime/collectives.h"
#include "runtime/internal_kernels.h"

namespace spmd::runtime {

namespace {

struct Call {
  const ir::Node& node;
  ir::ReplicaAttrs attrs;
  MeshGroups groups;
  std::shared_ptr<Collectives> collectives;
  std::vector<int64_t> replicas;  // this process's device i runs replica replicas[i]
};

// The groups as a mesh of shape [num_groups, k] whose rows are the groups: MeshGroups over
// axis 1 then lists exactly those groups, members in the order given.
MeshGroups GroupsOf(const ir::ReplicaAttrs& a) {
  std::vector<int64_t> ids;
  for (const auto& g : a.groups) ids.insert(ids.end(), g.begin(), g.end());
  const int64_t k = a.group_size();
  Mesh mesh(std::move(ids), {static_cast<int64_t>(a.groups.size()), k});
  return MeshGroups(mesh, {1});
}

Call Prepare(const ir::Node& node) {
  ir::ReplicaAttrs attrs = ir::ReplicaAttrs::Read(*node.op(), node.args());
  MeshGroups groups = GroupsOf(attrs);
  std::shared_ptr<Collectives> collectives = Collectives::Replicas();
  std::vector<int64_t> replicas;
  for (int64_t r = 0; r < attrs.world_size(); ++r)
    if (collectives->IsLocal(r)) replicas.push_back(r);
  const int64_t n = DeviceSet::Get().num_devices();
  SPMD_CHECK(static_cast<int64_t>(replicas.size()) == n, node.op()->qualified, " over ",
             attrs.world_size(), " replicas needs one device per replica: this process has ", n,
             " devices but runs ", replicas.size(), " replicas with ", collectives->name(),
             " collectives (xm collectives across replicas need multi-process mode, xmp.spawn)");
  return Call{node, std::move(attrs), std::move(groups), std::move(collectives),
              std::move(replicas)};
}

// Replica-indexed inputs from per-device buffers, and back.
DeviceTensors Inputs(const Call& c, const PerDevice& buffers) {
  DeviceTensors in(c.attrs.world_size());
  for (size_t i = 0; i < c.replicas.size(); ++i) in[c.replicas[i]] = buffers.at(i)->tensor;
  return in;
}

PerDevice Outputs(const Call& c, int output, const DeviceTensors& out) {
  const TensorType& want = c.node.output(output);
  const std::string label = c.node.op()->qualified + " -> " + want.ToString();
  PerDevice result(c.replicas.size());
  for (size_t i = 0; i < c.replicas.size(); ++i) {
    const at::Tensor& t = out.at(c.replicas[i]);
    SPMD_CHECK(t.defined() && t.sizes().vec() == want.shape &&
                   FromScalarType(t.scalar_type()) == want.dtype,
               "internal error: ", c.node.op()->qualified, " produced ",
               t.defined() ? TypeOf(t).ToString() : "nothing", " where the program expects ",
               want.ToString());
    result[i] = MakeBuffer(i, t, label);
  }
  return result;
}

// `t` times `scale`, keeping its dtype (PyTorch/XLA scales only when scale != 1).
at::Tensor Scaled(const at::Tensor& t, double scale) {
  if (scale == 1.0) return t;
  return t.mul(scale).to(t.scalar_type());
}

DeviceTensors ScaledAll(DeviceTensors v, double scale) {
  for (at::Tensor& t : v)
    if (t.defined()) t = Scaled(t, scale);
  return v;
}

// All inputs of one dtype travel as one flat buffer: one collective per dtype, as XLA
// coalesces the list form of all_reduce into one cross-replica sum.
std::vector<PerDevice> AllReduce(const Call& c, const std::vector<const PerDevice*>& inputs) {
  std::map<at::ScalarType, std::vector<size_t>> by_dtype;
  for (size_t j = 0; j < inputs.size(); ++j)
    by_dtype[inputs[j]->at(0)->tensor.scalar_type()].push_back(j);
  std::vector<PerDevice> results(inputs.size());
  for (const auto& [dtype, members] : by_dtype) {
    DeviceTensors flat(c.attrs.world_size());
    for (size_t i = 0; i < c.replicas.size(); ++i) {
      std::vector<at::Tensor> parts;
      for (size_t j : members) parts.push_back(inputs[j]->at(i)->tensor.reshape({-1}));
      flat[c.replicas[i]] = parts.size() == 1 ? parts[0] : at::cat(parts);
    }
    DeviceTensors reduced =
        ScaledAll(c.collectives->AllReduce(flat, c.groups, c.attrs.op), c.attrs.scale);
    for (size_t j : members) {
      DeviceTensors out(c.attrs.world_size());
      for (size_t i = 0; i < c.replicas.size(); ++i) {
        const at::Tensor& whole = reduced[c.replicas[i]];
        const at::Tensor& x = inputs[j]->at(i)->tensor;
        if (members.size() == 1) {
          out[c.replicas[i]] = whole.view(x.sizes());
          continue;
        }
        int64_t offset = 0;
        for (size_t p : members) {
          if (p == j) break;
          offset += inputs[p]->at(i)->tensor.numel();
        }
        // A compact copy: a view would keep the whole bucket alive behind a smaller buffer.
        out[c.replicas[i]] = whole.narrow(0, offset, x.numel()).view(x.sizes()).clone();
      }
      results[j] = Outputs(c, static_cast<int>(j), out);
    }
  }
  return results;
}

DeviceTensors AllGather(const Call& c, const DeviceTensors& in, const at::Tensor& x) {
  const int64_t dim = c.attrs.dim;
  return c.collectives->AllGather(in, c.groups, dim, x.size(dim) * c.attrs.group_size());
}

DeviceTensors ReduceScatter(const Call& c, const DeviceTensors& in, const at::Tensor& x) {
  const int64_t dim = c.attrs.dim;
  return ScaledAll(c.collectives->ReduceScatter(in, c.groups, dim, c.attrs.op, x.size(dim)),
                   c.attrs.scale);
}

DeviceTensors AllToAll(const Call& c, const DeviceTensors& in, const at::Tensor& x) {
  const int64_t s = c.attrs.split_dim, d = c.attrs.concat_dim, k = c.attrs.group_size();
  if (s != d)
    return c.collectives->AllToAll(in, c.groups, s, d, x.size(s), x.size(d) * k);
  // One dim both split and concatenated: view it as [k, extent/k], move the k chunks across
  // the group on the first and concatenate on the second, then merge the two back.
  std::vector<int64_t> shape = x.sizes().vec();
  shape[s] = x.size(s) / k;
  shape.insert(shape.begin() + s, k);
  DeviceTensors split(in.size());
  for (size_t r = 0; r < in.size(); ++r)
    if (in[r].defined()) split[r] = in[r].reshape(shape);
  DeviceTensors out = c.collectives->AllToAll(split, c.groups, s, s + 1, k, x.size(s));
  for (at::Tensor& t : out)
    if (t.defined()) t = t.reshape(x.sizes());
  return out;
}

using SingleKernel = DeviceTensors (*)(const Call&, const DeviceTensors&, const at::Tensor&);

void RegisterSingle(const ir::OpInfo* op, SingleKernel kernel) {
  RegisterInternalKernel(op->qualified, [kernel](const ir::Node& node,
                                                 const std::vector<const PerDevice*>& inputs) {
    SPMD_CHECK(inputs.size() == 1, node.op()->qualified, " takes one tensor, got ", inputs.size());
    Call c = Prepare(node);
    DeviceTensors in = Inputs(c, *inputs[0]);
    DeviceTensors out = kernel(c, in, in[c.replicas.at(0)]);
    return std::vector<PerDevice>{Outputs(c, 0, out)};
  });
}

}  // namespace

void RegisterReplicaKernels() {
  const ir::ReplicaOps& ops = ir::ReplicaOps::Get();
  RegisterInternalKernel(ops.all_reduce->qualified,
                         [](const ir::Node& node, const std::vector<const PerDevice*>& inputs) {
                           return AllReduce(Prepare(node), inputs);
                         });
  RegisterSingle(ops.all_gather, AllGather);
  RegisterSingle(ops.reduce_scatter, ReduceScatter);
  RegisterSingle(ops.all_to_all, AllToAll);
}

}  // namespace spmd::runtime
