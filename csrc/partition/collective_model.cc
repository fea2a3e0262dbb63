#include "partition/collective_model.h"

#include <algorithm>
#include <cmath>
#include <map>

namespace spmd::partition {

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

double RingSteps(int64_t r, int torus_dims) {
  if (r <= 1) return 0;
  // The sides of a compact sub-torus of r chips: for each dimension left, the smallest divisor
  // of what remains that is at least its share (the i-th root), so 8192 = 32 x 16 x 16.
  int64_t rest = r, steps = 0;
  for (int i = std::max(torus_dims, 1); i >= 1; --i) {
    const double share = std::pow(static_cast<double>(rest), 1.0 / i) - 1e-9;
    int64_t side = 1;
    while (side < rest && (side < share || rest % side != 0)) ++side;
    steps += side - 1;
    rest /= side;
  }
  return static_cast<double>(steps);
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

CollectiveTime CollectiveSeconds(const CollectiveStat& c, const Hardware& hw) {
  CollectiveTime t;
  t.kind = c.kind;
  const double n = static_cast<double>(c.group_size);
  if (n <= 1) return t;
  const GroupPlacement place = PlaceGroup(c.first_group, c.group_size, hw.devices_per_domain);
  t.crosses_hosts = place.domains > 1;
  const double k = static_cast<double>(place.domains), m = static_cast<double>(place.per_domain);
  const double s = static_cast<double>(c.bytes);  // each device's input buffer
  const double lat = hw.link_latency, inside = hw.ring_bandwidth, across = hw.cross_domain_bandwidth;
  auto consider = [&t](const char* algorithm, double seconds) {
    if (t.algorithm.empty() || seconds < t.seconds) {
      t.algorithm = algorithm;
      t.seconds = seconds;
    }
  };
  // One ring through the whole group: across domains, one ring per NIC of the m members a
  // domain holds; inside one, a ring per torus dimension where the domain is a torus.
  const double ring_bandwidth = t.crosses_hosts ? std::min(inside, m * across) : inside;
  const double ring_steps = t.crosses_hosts ? n - 1 : RingSteps(c.group_size, hw.torus_dims);
  if (c.kind == "collective-permute") {
    consider("exchange", s / (t.crosses_hosts ? across : inside) + lat);
    return t;
  }
  if (c.kind == "all-to-all") {
    const double local = (m - 1) / n * s / inside, remote = (n - m) / n * s / across;
    consider("pairwise", std::max(local, remote) + ring_steps * lat);
    return t;
  }
  const double phases = c.kind == "all-reduce" ? 2 : 1;
  consider("ring", RingBytes(c.kind, n, s) / ring_bandwidth + phases * ring_steps * lat);
  if (c.kind == "all-reduce")
    consider("tree", 2 * s / (kTreeBandwidthFactor * ring_bandwidth) +
                         2 * std::ceil(std::log2(n)) * lat);
  if (t.crosses_hosts && m > 1) {
    // Inside each domain over its m members, across domains over k members on 1/m of the data.
    const double intra_steps = RingSteps(place.per_domain, hw.torus_dims) * lat;
    if (c.kind == "all-gather") {
      consider("hierarchical", RingBytes(c.kind, k, s) / across + (k - 1) * lat +
                                   RingBytes(c.kind, m, k * s) / inside + intra_steps);
    } else {
      // reduce-scatter: inside, then across; all-reduce adds the all-gather back inside.
      const double intra = RingBytes("reduce-scatter", m, s) / inside + intra_steps;
      consider("hierarchical", phases * intra + RingBytes(c.kind, k, s / m) / across +
                                   phases * (k - 1) * lat);
    }
  }
  return t;
}

}  // namespace spmd::partition
