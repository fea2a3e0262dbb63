// How long one collective takes, given where its group sits on the interconnect
// (plan/hardware.h) and the algorithms runtimes choose between.
//
// Each algorithm is a sequence of phases; a phase over r members moves, per device, the ring
// formulas' bytes (NCCL's performance notes; s = each device's input buffer):
//   all-gather (r-1) s, reduce-scatter and all-to-all (r-1)/r s, all-reduce 2 (r-1)/r s,
// over its bandwidth, plus one link latency per step: r-1 steps for a ring (twice for an
// all-reduce), sum(d_i - 1) over the sides d_i of the torus the r members span (a ring per
// dimension, one after another: the same bytes, fewer steps), 2 ceil(log2 r) for a tree.
//
// A group of n members over k domains, m of them (at least) in each:
// - ring: one ring through all n. Inside one domain it rides ring_bandwidth (on a torus, a
//   ring per dimension). Across domains NCCL runs one ring per NIC, so the m members a domain
//   holds send its crossing traffic over m NICs in parallel: bandwidth
//   min(ring_bandwidth, m * cross_domain_bandwidth), n-1 steps.
// - tree (all-reduce only; NCCL's double binary tree): 2 s per device at 0.92 x the ring's
//   bandwidth (NCCL's tuner derates trees so), 2 ceil(log2 n) steps: what small all-reduces
//   over many devices use.
// - hierarchical (all-gather, reduce-scatter, all-reduce over k > 1 TPU slices; XLA's
//   multi-slice collectives over DCN): reduce-scatter inside each domain, the collective across
//   domains on 1/m of the data (each device over its own cross-domain link), all-gather inside
//   again. NCCL has no such algorithm (GPU hosts: ring or tree).
// The runtime is assumed to pick the fastest: the time is the minimum over the algorithms that
// apply. All-to-all (pairwise): the part a device sends inside its domain, (m-1)/n s, over
// ring_bandwidth, and the rest, (n-m)/n s, over its own cross-domain link, concurrently, with
// a ring's latency steps. Collective-permute (exchange): one exchange of s with one latency,
// over the cross-domain link when the group spans domains.
#pragma once
#include <string>
#include <vector>

#include "partition/program.h"
#include "plan/hardware.h"

namespace spmd::plan {

// The compiler's types this floor reads.
using partition::CollectiveStat;

// Where a group's members sit: over how many domains, with at least how many in each.
struct GroupPlacement {
  int64_t members = 0;
  int64_t domains = 1;
  int64_t per_domain = 0;
};
// `group` (device ids; empty: unknown, taken as one domain) of `members` devices.
GroupPlacement PlaceGroup(const std::vector<int64_t>& group, int64_t members,
                          int64_t devices_per_domain);

// The sides of a compact torus of r chips in `torus_dims` dimensions, largest first (as equal
// as r's divisors allow: 8192 chips are 32 x 16 x 16; a prime number of chips is one ring).
// A domain of that many chips is taken to be that torus, its device ids running along the
// first side fastest, then the next (a mesh's last axis along one physical dimension, as
// jax.experimental.mesh_utils lays out MaxText's).
std::vector<int64_t> CompactSides(int64_t r, int torus_dims);
// Latency steps of one ring phase over r members inside a domain: r-1 on a switch; on a torus
// of `torus_dims` dimensions, a ring per dimension of the compact sub-torus of r chips.
double RingSteps(int64_t r, int torus_dims);

// How a group's ring phase runs on its domain's torus: a ring per dimension its members span
// (`steps`: the sum of those extents less one), and, since each dimension has links of its
// own, all of them at once: the data split between them (half one way round, as XLA's
// multi-dimensional collectives and the scaling book's "multi-axis AllGather" do), so the
// bandwidth is `bandwidth_factor` x a dimension's ring: 1 for each whole dimension spanned, a
// half for part of one (a line, reached one way at its far end). `members` are device ids
// (domain by domain, `domain_devices` each) laid along the sides TorusSidesFor gives; a switch
// (torus_dims 0) is one ring.
struct TorusSpan {
  double steps = 0;
  double bandwidth_factor = 1;
};
TorusSpan SpanOnTorus(const std::vector<int64_t>& members, int64_t domain_devices, int torus_dims,
                      const std::vector<int64_t>* mesh_shape = nullptr);
// The sides of a slice of `devices` chips in the order device ids run along them: the compact
// sides, ordered so that the minor axes of the mesh (`mesh_shape`, major to minor; none:
// largest side first) each fill whole dimensions where the sides allow, as
// jax.experimental.mesh_utils lays a mesh's axes onto the physical ones (a (256, 8) mesh on
// 2,048 v5p chips, 16 x 16 x 8: the 8 first).
std::vector<int64_t> TorusSidesFor(int64_t devices, int torus_dims,
                                   const std::vector<int64_t>* mesh_shape);

struct CollectiveTime {
  std::string kind;
  double seconds = 0;
  bool crosses_hosts = false;  // the group spans domains (GPU hosts, TPU slices)
  std::string algorithm;  // ring, tree, hierarchical, pairwise, exchange; empty: a group of one
  double start = 0;            // in the step's schedule (plan/step_schedule.h)
  double exposed_seconds = 0;  // of the compute stream's waiting, the part charged to this one
  // The links it takes (CollectiveStat::channel), except that a permute around a ring whose
  // members lie on a line (part of a torus dimension, no wraparound link) takes both
  // directions: its wrapping pair travels back along every link.
  int channel = 0;
};

CollectiveTime CollectiveSeconds(const CollectiveStat& c, const Hardware& hw);

}  // namespace spmd::plan
