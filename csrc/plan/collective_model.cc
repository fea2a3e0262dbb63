#include "plan/collective_model.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

namespace spmd::plan {

GroupPlacement PlaceGroup(const std::vector<int64_t>& group, int64_t members,
                          int64_t devices_per_domain) {
  GroupPlacement p;
  p.members = members;
  p.per_domain = members;
  if (devices_per_domain <= 0 || group.empty()) return p;
  std::map<int64_t, int64_t> per_domain;
  for (int64_t id : group) ++per_domain[id / devices_per_domain];
  p.domains = static_cast<int64_t>(per_domain.size());
  p.per_domain = members;
  for (const auto& [domain, count] : per_domain) p.per_domain = std::min(p.per_domain, count);
  return p;
}

std::vector<int64_t> CompactSides(int64_t r, int torus_dims) {
  // For each dimension left, the smallest divisor of what remains that is at least its share
  // (the i-th root), so 8192 = 32 x 16 x 16.
  std::vector<int64_t> sides;
  int64_t rest = std::max<int64_t>(r, 1);
  for (int i = std::max(torus_dims, 1); i >= 1; --i) {
    const double share = std::pow(static_cast<double>(rest), 1.0 / i) - 1e-9;
    int64_t side = 1;
    while (side < rest && (side < share || rest % side != 0)) ++side;
    sides.push_back(side);
    rest /= side;
  }
  std::sort(sides.rbegin(), sides.rend());
  return sides;
}

double RingSteps(int64_t r, int torus_dims) {
  if (r <= 1) return 0;
  double steps = 0;
  for (int64_t side : CompactSides(r, torus_dims)) steps += static_cast<double>(side - 1);
  return steps;
}

std::vector<int64_t> TorusSidesFor(int64_t devices, int torus_dims,
                                   const std::vector<int64_t>* mesh_shape) {
  std::vector<int64_t> sides = CompactSides(devices, torus_dims);  // largest first
  if (!mesh_shape || mesh_shape->empty()) return sides;
  // The mesh's minor axes, gathered: 8, then 8 x 64 for a (256, 8) mesh.
  std::vector<int64_t> spans;
  int64_t product = 1;
  for (auto it = mesh_shape->rbegin(); it != mesh_shape->rend() && product < devices; ++it)
    if (*it > 1) spans.push_back(product *= *it);
  auto score = [&](const std::vector<int64_t>& order) {
    int hits = 0;
    int64_t p = 1;
    for (size_t k = 0; k + 1 < order.size(); ++k)
      hits += std::count(spans.begin(), spans.end(), p *= order[k]) > 0;
    return hits;
  };
  std::vector<int64_t> order = sides, best = sides;
  int best_score = score(sides);
  while (std::prev_permutation(order.begin(), order.end()))
    if (score(order) > best_score) {
      best = order;
      best_score = score(order);
    }
  return best;
}

TorusSpan SpanOnTorus(const std::vector<int64_t>& members, int64_t domain_devices,
                      int torus_dims, const std::vector<int64_t>* mesh_shape) {
  TorusSpan span;
  const int64_t r = static_cast<int64_t>(members.size());
  if (r <= 1) return span;
  if (torus_dims <= 0 || domain_devices <= 1) {
    span.steps = static_cast<double>(r - 1);
    return span;
  }
  const std::vector<int64_t> sides = TorusSidesFor(domain_devices, torus_dims, mesh_shape);
  span.steps = 0;
  span.bandwidth_factor = 0;
  int64_t stride = 1;
  for (int64_t side : sides) {
    std::vector<bool> seen(side, false);
    int64_t extent = 0;
    for (int64_t id : members) {
      const int64_t c = (id % domain_devices) / stride % side;
      if (!seen[c]) {
        seen[c] = true;
        ++extent;
      }
    }
    stride *= side;
    if (extent <= 1) continue;
    span.steps += static_cast<double>(extent - 1);
    // A whole dimension is a ring (its wraparound link closes it), part of one a line, whose
    // far end is reached one way only: half the bandwidth.
    span.bandwidth_factor += extent == side ? 1.0 : 0.5;
  }
  if (span.bandwidth_factor <= 0) span.bandwidth_factor = 1;
  return span;
}

namespace {

// A tree reaches this fraction of the ring's bandwidth (NCCL's tuner, src/graph/tuning.cc:
// busBw * .92 for NCCL_ALGO_TREE), so large all-reduces stay on rings.
constexpr double kTreeBandwidthFactor = 0.92;

// Bytes each device sends in one ring phase of `kind` over r members, on input s.
double RingBytes(const std::string& kind, double r, double s) {
  if (kind == "all-gather") return (r - 1) * s;  // the input is one shard of the gathered r s
  if (kind == "all-reduce") return 2 * (r - 1) / r * s;  // reduce-scatter, then all-gather
  return (r - 1) / r * s;  // reduce-scatter
}

}  // namespace

namespace {

// Where one collective's group sits and what its links carry: the numbers every algorithm's
// time is made of.
struct GroupOnLinks {
  GroupOnLinks(const CollectiveStat& c, const Hardware& hw)
      : c(c), hw(hw), place(PlaceGroup(c.first_group, c.group_size, hw.devices_per_domain)),
        crosses(place.domains > 1), n(static_cast<double>(c.group_size)),
        k(static_cast<double>(place.domains)), m(static_cast<double>(place.per_domain)),
        s(static_cast<double>(c.bytes)), lat(hw.link_latency), inside(hw.ring_bandwidth),
        across(hw.cross_domain_bandwidth),
        domain_devices(hw.devices_per_domain > 0 && c.mesh_devices > 0
                           ? std::min(hw.devices_per_domain, c.mesh_devices)
                           : (hw.devices_per_domain > 0 ? hw.devices_per_domain
                                                        : c.mesh_devices)) {}

  // Inside a domain, where `members` sit on its torus: a ring per dimension they span, all of
  // those dimensions' links at once (plan/collective_model.h).
  TorusSpan SpanOf(const std::vector<int64_t>& members, int64_t count) const {
    if (hw.torus_dims <= 0) return TorusSpan{count - 1.0, 1.0};
    if (members.empty() || domain_devices <= 0) {  // where they sit unknown: a compact torus
      TorusSpan compact{RingSteps(count, hw.torus_dims), 0.0};
      for (int64_t side : CompactSides(count, hw.torus_dims)) compact.bandwidth_factor += side > 1;
      compact.bandwidth_factor = std::max(compact.bandwidth_factor, 1.0);
      return compact;
    }
    return SpanOnTorus(members, domain_devices, hw.torus_dims, c.mesh_shape.get());
  }

  const CollectiveStat& c;
  const Hardware& hw;
  const GroupPlacement place;
  const bool crosses;  // the group spans GPU hosts or TPU slices
  // group size, domains, members per domain, each device's input bytes, link latency, the
  // ring bandwidth inside a domain and each device's share across domains
  const double n, k, m, s, lat, inside, across;
  const int64_t domain_devices;
};

// XLA's multi-slice collectives (NCCL has no such algorithm: ring or tree): inside each
// domain over its m members, across domains over k members on 1/m of the data.
double HierarchicalSeconds(const GroupOnLinks& g) {
  const CollectiveStat& c = g.c;
  std::vector<int64_t> local_members;
  for (int64_t id : c.first_group)
    if (id / g.hw.devices_per_domain == c.first_group[0] / g.hw.devices_per_domain)
      local_members.push_back(id);
  const TorusSpan local = g.SpanOf(local_members, g.place.per_domain);
  const double intra_steps = local.steps * g.lat;
  const double intra_bandwidth = g.inside * local.bandwidth_factor;
  if (c.kind == "all-gather")
    return RingBytes(c.kind, g.k, g.s) / g.across + (g.k - 1) * g.lat +
           RingBytes(c.kind, g.m, g.k * g.s) / intra_bandwidth + intra_steps;
  // reduce-scatter: inside, then across; all-reduce adds the all-gather back inside.
  const double phases = c.kind == "all-reduce" ? 2 : 1;
  const double intra = RingBytes("reduce-scatter", g.m, g.s) / intra_bandwidth + intra_steps;
  return phases * intra + RingBytes(c.kind, g.k, g.s / g.m) / g.across +
         phases * (g.k - 1) * g.lat;
}

}  // namespace

CollectiveTime CollectiveSeconds(const CollectiveStat& c, const Hardware& hw) {
  CollectiveTime t;
  t.kind = c.kind;
  t.channel = c.channel;
  if (c.kind == "device-to-host" || c.kind == "host-to-device") {
    // Each device's own link to its host (PCIe), one direction.
    t.algorithm = "host link";
    t.seconds = static_cast<double>(c.bytes) / hw.host_bandwidth + hw.link_latency;
    return t;
  }
  if (c.group_size <= 1) return t;
  const GroupOnLinks g(c, hw);
  t.crosses_hosts = g.crosses;
  auto consider = [&t](const char* algorithm, double seconds) {
    if (t.algorithm.empty() || seconds < t.seconds) {
      t.algorithm = algorithm;
      t.seconds = seconds;
    }
  };
  // One ring through the whole group: across domains, one ring per NIC of the m members a
  // domain holds; inside one, as its torus span says.
  const TorusSpan span = g.crosses ? TorusSpan{g.n - 1, 1.0} : g.SpanOf(c.first_group, c.group_size);
  const double ring_bandwidth =
      g.crosses ? std::min(g.inside, g.m * g.across) : g.inside * span.bandwidth_factor;
  if (c.kind == "collective-permute") {
    // Each member sends to one other: on a torus one link, one way (a ring's bandwidth is both
    // ways of a dimension's two links); through a switch, the GPU's own bandwidth one way.
    const double one_way = hw.torus_dims > 0 ? g.inside / 2 : g.inside;
    if (hw.torus_dims > 0 && !g.crosses && span.bandwidth_factor < 1) t.channel = 0;
    consider("exchange", g.s / (g.crosses ? g.across : one_way) + g.lat);
    return t;
  }
  if (c.kind == "all-to-all") {
    const double local = (g.m - 1) / g.n * g.s / g.inside;
    const double remote = (g.n - g.m) / g.n * g.s / g.across;
    consider("pairwise", std::max(local, remote) + span.steps * g.lat);
    return t;
  }
  const double phases = c.kind == "all-reduce" ? 2 : 1;
  consider("ring", RingBytes(c.kind, g.n, g.s) / ring_bandwidth + phases * span.steps * g.lat);
  // A tree sends each byte over one link per level: one dimension's ring bandwidth.
  if (c.kind == "all-reduce")
    consider("tree", 2 * g.s / (kTreeBandwidthFactor *
                                (g.crosses ? std::min(g.inside, g.m * g.across) : g.inside)) +
                         2 * std::ceil(std::log2(g.n)) * g.lat);
  if (g.crosses && g.m > 1 && hw.torus_dims > 0) consider("hierarchical", HierarchicalSeconds(g));
  return t;
}

}  // namespace spmd::plan
