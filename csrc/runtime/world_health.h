// Failure propagation across the processes of a multi-process SPMD world (issue 51).
//
// Without it a process waits in its next exchange until the process group's timeout
// (SPMD_DIST_TIMEOUT, 30 min) when another one fails its step but lives on (it caught the error),
// or was stopped (SIGSTOP, a debugger, a swapped-out host): a stopped process is
// indistinguishable from a slow one, and gloo's sockets stay open. So every process of the world
// runs a monitor thread over the world's store (C++: no GIL, so a long step in Python cannot
// starve it):
//
// - it writes this process's heartbeat (a counter) every poll, and watches every other's: one
//   that has not moved for the heartbeat interval (SPMD_HEARTBEAT_SECONDS, default 30) aborts
//   the world, naming that process ("stopped, hung or gone"); a process that leaves the world
//   normally says so first and is not watched any more;
// - a step that raises in one process posts its error (PostFailure, the first one wins) before
//   the error reaches Python: every other process sees it within a poll and aborts.
//
// An aborted world makes every exchange raise at once, the one a process is waiting in included
// (Wait): collectives are polled, point-to-point transfers aborted by the monitor. What the
// exception names: the process and its error, or the silent one. The world cannot go on after
// that (the processes' programs are out of step): each process raises, its launcher
// (spawn_spmd, torchrun) sees it exit and stops the rest.
#pragma once
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <optional>
#include <string>

namespace spmd::runtime {

class WorldHealth {
 public:
  // Starts the monitor of process `rank` of `count` over `store`, with a heartbeat interval of
  // `heartbeat_seconds`; replaces a running one.
  static void Start(c10::intrusive_ptr<c10d::Store> store, int rank, int count,
                    double heartbeat_seconds);
  // Leaves the world normally: the others stop watching this process. No-op when not running.
  static void Stop();
  // This process's step failed with `message`: the other processes abort, naming it.
  static void PostFailure(const std::string& message);
  // Why the world was aborted, once it was.
  static std::optional<std::string> Aborted();
  // Waits for `work` (an exchange of `what`), raising std::runtime_error as soon as the world
  // is aborted, or with the exchange's own error, completed with the reason the world gives.
  static void Wait(const c10::intrusive_ptr<c10d::Work>& work, const char* what);
};

}  // namespace spmd::runtime
