// Static analysis of a partitioned program, without running it: FLOPs per device (from the
// rules' iteration spaces) and the per-device peak of live buffer bytes (from liveness).
#pragma once
#include "partition/program.h"

namespace spmd::partition {

// Peak bytes held by one device while the program runs: parameters stay live throughout,
// every other value from its definition to its last use (outputs to the end).
int64_t PeakBytesPerDevice(const Program& program);

// FLOPs one device spends on a local op: 2 per point of the iteration space for contractions
// (matmul family, convolution), 1 per output element otherwise.
double LocalOpFlops(const ir::Node& node);

}  // namespace spmd::partition
