#include "runtime/world_health.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <unordered_set>
#include <vector>

#include "runtime/error_message.h"

namespace spmd::runtime {

namespace {

using Clock = std::chrono::steady_clock;

const std::string kAbortKey = "abort";
const std::string kLeft = "left";  // the heartbeat of a process that left the world
std::string BeatKey(int rank) { return "beat/" + std::to_string(rank); }

std::vector<uint8_t> Bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string Text(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

struct State {
  c10::intrusive_ptr<c10d::Store> store;
  int rank = 0, count = 1;
  std::chrono::duration<double> heartbeat{30.0};
  std::mutex mu;
  std::condition_variable cv;  // an exchange completed, the world aborted, or Stop
  bool stopping = false;
  std::optional<std::string> aborted;
  std::unordered_set<c10d::Work*> point_to_point;  // in flight: the monitor aborts them
  std::thread monitor;

  void Abort(const std::string& why) {
    std::lock_guard<std::mutex> lock(mu);
    if (aborted) return;
    aborted = why;
    for (c10d::Work* w : point_to_point) {
      try {
        w->abort();
      } catch (const std::exception&) {  // (a transfer that cannot be aborted completes or fails)
      }
    }
    cv.notify_all();
  }

  // Posts `why` for every process (the first posted wins) and aborts here.
  void Post(const std::string& why) {
    try {
      store->compareSet(kAbortKey, {}, Bytes(why));
    } catch (const std::exception&) {  // the store is gone: the others see that themselves
    }
    Abort(why);
  }

  // Polls the abort key every second at most; writes this process's heartbeat and reads the
  // others' every quarter interval (a store round trip per process each time).
  void Run() {
    using Seconds = std::chrono::duration<double>;
    const Seconds beat_every = heartbeat / 4;
    const Seconds poll = std::clamp(beat_every, Seconds(0.02), Seconds(1.0));
    std::vector<std::string> last(count);
    std::vector<Clock::time_point> moved(count, Clock::now());
    int64_t beats = 0;
    Clock::time_point next_beat = Clock::now();
    std::unique_lock<std::mutex> lock(mu);
    while (!stopping) {
      lock.unlock();
      try {
        if (store->check({kAbortKey})) Abort(Text(store->get(kAbortKey)));
        if (Clock::now() >= next_beat) {
          next_beat = Clock::now() + std::chrono::duration_cast<Clock::duration>(beat_every);
          store->set(BeatKey(rank), Bytes(std::to_string(++beats)));
          Watch(last, moved);
        }
      } catch (const std::exception& e) {
        Abort(std::string("the world's store (hosted by process 0) is unreachable: ") +
              UserMessage(e));
      }
      lock.lock();
      cv.wait_for(lock, poll, [&] { return stopping; });
    }
  }

  // The others' heartbeats: one that has not moved for the interval aborts the world. A
  // process that left says so in its heartbeat ("left").
  void Watch(std::vector<std::string>& last, std::vector<Clock::time_point>& moved) {
    const Clock::time_point now = Clock::now();
    for (int p = 0; p < count; ++p) {
      if (p == rank || last[p] == kLeft) continue;
      if (last[p].empty() && !store->check({BeatKey(p)})) {  // not started yet
        if (now - moved[p] <= heartbeat) continue;
      } else {
        const std::string beat = Text(store->get(BeatKey(p)));
        if (beat != last[p]) {
          last[p] = beat;
          moved[p] = now;
          continue;
        }
      }
      if (now - moved[p] > heartbeat && !Aborted()) {
        const auto silent = std::chrono::duration<double>(now - moved[p]).count();
        Post("process " + std::to_string(p) + " has sent no heartbeat for " +
             std::to_string(static_cast<int>(silent)) +
             " s (stopped, hung, or its host is unreachable; SPMD_HEARTBEAT_SECONDS=" +
             std::to_string(heartbeat.count()) + ")");
      }
    }
  }

  std::optional<std::string> Aborted() {
    std::lock_guard<std::mutex> lock(mu);
    return aborted;
  }
};

std::mutex g_mu;
std::shared_ptr<State> g_state;

std::shared_ptr<State> Current() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_state;
}

[[noreturn]] void RaiseAborted(const std::string& why, const char* what) {
  throw std::runtime_error(std::string("multi-process SPMD: the world was aborted (in ") + what +
                           "): " + why);
}

bool PointToPoint(const c10d::Work& work) {
  const c10d::OpType t = work.retrieveOpType();
  return t == c10d::OpType::SEND || t == c10d::OpType::RECV ||
         t == c10d::OpType::RECVANYSOURCE;
}

}  // namespace

void WorldHealth::Start(c10::intrusive_ptr<c10d::Store> store, int rank, int count,
                        double heartbeat_seconds) {
  Stop();
  auto s = std::make_shared<State>();
  s->store = c10::make_intrusive<c10d::PrefixStore>("spmd_world_health", std::move(store));
  s->rank = rank;
  s->count = count;
  s->heartbeat = std::chrono::duration<double>(heartbeat_seconds);
  s->monitor = std::thread([s] { s->Run(); });
  std::lock_guard<std::mutex> lock(g_mu);
  g_state = std::move(s);
}

void WorldHealth::Stop() {
  std::shared_ptr<State> s;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    s = std::move(g_state);
  }
  if (!s) return;
  {
    std::lock_guard<std::mutex> lock(s->mu);
    s->stopping = true;
  }
  s->cv.notify_all();
  if (s->monitor.joinable()) s->monitor.join();
  try {  // (after the monitor's last heartbeat)
    s->store->set(BeatKey(s->rank), Bytes(kLeft));
  } catch (const std::exception&) {
  }
}

void WorldHealth::PostFailure(const std::string& message) {
  if (std::shared_ptr<State> s = Current())
    s->Post("process " + std::to_string(s->rank) + " failed its step: " + message);
}

std::optional<std::string> WorldHealth::Aborted() {
  std::shared_ptr<State> s = Current();
  return s ? s->Aborted() : std::nullopt;
}

void WorldHealth::Wait(const c10::intrusive_ptr<c10d::Work>& work, const char* what) {
  std::shared_ptr<State> s = Current();
  if (!s) {
    try {
      work->wait();
    } catch (const std::exception& e) {
      // A peer that died or timed out: name the collective, keep gloo's reason.
      throw std::runtime_error(std::string(what) + " across processes failed: " + UserMessage(e));
    }
    return;
  }
  if (auto why = s->Aborted()) RaiseAborted(*why, what);
  std::string failure;  // the exchange's own error
  bool interrupted = false;
  try {
    if (PointToPoint(*work)) {
      {
        std::lock_guard<std::mutex> lock(s->mu);
        s->point_to_point.insert(work.get());
      }
      struct Unregister {
        State& s;
        c10d::Work* w;
        ~Unregister() {
          std::lock_guard<std::mutex> lock(s.mu);
          s.point_to_point.erase(w);
        }
      } unregister{*s, work.get()};
      work->wait();  // (the monitor aborts it when the world aborts)
    } else {
      c10::intrusive_ptr<c10::ivalue::Future> done = work->getFuture();
      done->addCallback([s](c10::ivalue::Future&) {
        std::lock_guard<std::mutex> lock(s->mu);
        s->cv.notify_all();
      });
      std::unique_lock<std::mutex> lock(s->mu);
      s->cv.wait(lock, [&] { return done->completed() || s->aborted.has_value(); });
      interrupted = !done->completed();
      lock.unlock();
      if (!interrupted) work->wait();
    }
  } catch (const std::exception& e) {
    failure = UserMessage(e);
  }
  if (!failure.empty()) {
    // A peer gone (its sockets closed): the monitor names it within a heartbeat interval.
    std::unique_lock<std::mutex> lock(s->mu);
    s->cv.wait_for(lock, s->heartbeat * 1.5, [&] { return s->aborted.has_value(); });
    if (s->aborted) RaiseAborted(*s->aborted + " (" + failure + ")", what);
    throw std::runtime_error(std::string(what) + " across processes failed: " + failure);
  }
  if (auto why = s->Aborted()) RaiseAborted(*why, what);
}

}  // namespace spmd::runtime
