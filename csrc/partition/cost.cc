#include "partition/cost.h"

#include <algorithm>
#include <map>
#include <unordered_map>
#include <utility>

namespace spmd::partition {

int64_t PeakBytesPerDevice(const Program& program) {
  // Per value (node output), as the runtime frees each output slot after its own last reader:
  // a multi-output op's big result may die long before its small sibling (grad_input vs
  // grad_weight of convolution_backward).
  using Key = std::pair<const ir::Node*, int>;
  const int end = static_cast<int>(program.nodes.size());
  std::map<Key, int> last_use;
  for (size_t i = 0; i < program.nodes.size(); ++i)
    for (const ir::Value& in : program.nodes[i]->inputs())
      last_use[{in.node.get(), in.index}] = static_cast<int>(i);
  for (const ir::Value& out : program.outputs) last_use[{out.node.get(), out.index}] = end;
  for (const ir::NodePtr& p : program.params) last_use[{p.get(), 0}] = end;

  // Sweep: a value's bytes count from its definition to its last use.
  std::vector<int64_t> delta(program.nodes.size() + 2, 0);
  for (size_t i = 0; i < program.nodes.size(); ++i) {
    const ir::Node& n = *program.nodes[i];
    for (int o = 0; o < n.num_outputs(); ++o) {
      const TensorType& t = n.output(o);
      if (t.dtype == DType::kUndefined) continue;
      auto it = last_use.find({&n, o});
      int until = it == last_use.end() ? static_cast<int>(i) : it->second;
      delta[i] += t.bytes();
      delta[until + 1] -= t.bytes();
    }
  }
  int64_t live = 0, peak = 0;
  for (int64_t d : delta) {
    live += d;
    peak = std::max(peak, live);
  }
  return peak;
}

double LocalOpFlops(const ir::Node& node) {
  const std::string& name = node.op()->name;
  auto dims = [&](int input) { return node.input(input).type().shape; };
  if (node.op()->internal) return 0;
  if (name == "aten::mm" || name == "aten::addmm" || name == "aten::bmm" ||
      name == "aten::baddbmm") {
    bool with_bias = name == "aten::addmm" || name == "aten::baddbmm";
    Shape a = dims(with_bias ? 1 : 0), b = dims(with_bias ? 2 : 1);
    double batch = a.size() == 3 ? a[0] : 1;
    return 2.0 * batch * a[a.size() - 2] * a.back() * b.back();
  }
  if (name == "aten::convolution" && node.num_outputs() >= 1) {
    Shape w = dims(1);
    double per_output = 1;
    for (size_t d = 1; d < w.size(); ++d) per_output *= w[d];  // in_channels/groups * kernel
    return 2.0 * NumElements(node.output(0).shape) * per_output;
  }
  if (name == "aten::convolution_backward") {
    Shape w = dims(2);
    double per_output = 1;
    for (size_t d = 1; d < w.size(); ++d) per_output *= w[d];
    return 4.0 * NumElements(dims(0)) * per_output;  // input and weight gradients
  }
  double flops = 0;
  for (const TensorType& t : node.outputs())
    if (t.dtype != DType::kUndefined) flops += NumElements(t.shape);
  return flops;
}

}  // namespace spmd::partition
