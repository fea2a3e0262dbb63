#include "partition/program.h"

#include <sstream>
#include <unordered_map>

#include "ir/internal_ops.h"

namespace spmd::partition {

namespace {

// "%4 = spmd::all_reduce(%3) axes={model} group=2 bytes=512 : f32[2,16] [{data}, {}]"
std::string CollectiveLine(const ir::Node& n, const std::string& input) {
  std::ostringstream os;
  const Sharding& layout = n.shardings().at(0);
  const Mesh& mesh = layout.mesh();
  std::vector<int> axes;
  int axes_arg = n.op()->ArgIndex("axes");
  if (axes_arg >= 0)
    for (int64_t a : n.arg(axes_arg).ints) axes.push_back(static_cast<int>(a));
  os << n.op()->qualified << "(" << input << ")";
  for (size_t a = 1; a < n.args().size(); ++a) {
    const std::string& name = n.op()->args[a].name;
    if (name == "axes") continue;
    os << " " << name << "=" << n.arg(a).ToString();
  }
  os << " axes={";
  for (size_t i = 0; i < axes.size(); ++i) os << (i ? "," : "") << mesh.AxisLabel(axes[i]);
  os << "} group=" << AxesSize(mesh, axes) << " bytes=" << n.input(0).type().bytes();
  return os.str();
}

}  // namespace

std::string Program::ToText() const {
  std::unordered_map<const ir::Node*, int> position;
  for (size_t i = 0; i < nodes.size(); ++i) position[nodes[i].get()] = static_cast<int>(i);
  auto name = [&](const ir::Value& v) {
    std::string s = "%" + std::to_string(position.at(v.node.get()));
    if (v.node->num_outputs() > 1) s += "." + std::to_string(v.index);
    return s;
  };
  std::ostringstream os;
  const ir::OpInfo* data_op = ir::InternalOps::Get().device_data;
  int param = 0;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const ir::Node& n = *nodes[i];
    os << "%" << i << " = ";
    if (n.op() == data_op) {
      os << "parameter(" << param++ << ")";
    } else if (n.op()->internal) {
      os << CollectiveLine(n, name(n.input(0)));
    } else {
      os << n.op()->qualified << "(";
      for (size_t a = 0; a < n.args().size(); ++a) {
        const ir::Arg& arg = n.args()[a];
        os << (a ? ", " : "");
        if (a < n.op()->args.size()) os << n.op()->args[a].name << "=";
        if (arg.kind == ir::Arg::Kind::kTensor) {
          os << name(n.input(arg.i));
        } else if (arg.kind == ir::Arg::Kind::kTensorList || arg.kind == ir::Arg::Kind::kOptTensorList) {
          os << "[";
          for (size_t j = 0; j < arg.ints.size(); ++j)
            os << (j ? ", " : "") << (arg.ints[j] < 0 ? std::string("None") : name(n.input(arg.ints[j])));
          os << "]";
        } else {
          os << arg.ToString();
        }
      }
      os << ")";
    }
    os << " : ";
    for (int o = 0; o < n.num_outputs(); ++o) {
      os << (o ? ", " : "") << n.output(o).ToString();
      if (o < static_cast<int>(n.shardings().size()) && n.shardings()[o].valid())
        os << " " << n.shardings()[o].ToNamedString();
    }
    os << "\n";
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Sharding& s = output_shardings[i];
    os << "output " << i << " = " << name(outputs[i]) << " : " << output_global_types[i].ToString()
       << " " << (s.valid() ? s.ToNamedString() : std::string("[replicated]")) << "\n";
  }
  int64_t total = 0;
  for (const CollectiveStat& c : stats.collectives) total += c.bytes;
  os << "collectives: " << stats.collectives.size() << " (" << total << " bytes per device), "
     << "peak bytes per device: " << stats.peak_bytes_per_device
     << ", flops per device: " << stats.flops_per_device << "\n";
  for (const auto& [op, count] : stats.replicated_fallback_ops)
    os << "replicated fallback: " << op << " x" << count << "\n";
  return os.str();
}

const OpTraits& Program::TraitsAt(size_t node_index) const {
  static const OpTraits* none = new OpTraits();
  return node_index < traits.size() ? traits[node_index] : *none;
}

}  // namespace spmd::partition
