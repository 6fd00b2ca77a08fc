#pragma once
// Timeline profiler (hyperpar-train --profile PATH): spans of what each rank did and when, as
// Chrome trace events (train/profile_trace.h writes one JSON file for all ranks, viewable in
// Perfetto or chrome://tracing).
//
// Two tracks per rank: kMain, the thread that runs forward, backward and the optimizer
// (blocking collectives and waits on asynchronous ones appear there, as time the rank could not
// compute); kComm, asynchronous collectives from issue until the rank saw them complete. A
// kComm span running beside kMain compute spans is communication overlapped with compute.
//
//   profile::set_enabled(true);
//   { profile::Span s("train", "forward"); ... }             // a span on kMain
//   profile::complete("all_gather", "comm", t0, profile::now_us(), profile::kComm, "tag");
//   std::vector<profile::Event> events = profile::take_events();
//
// Disabled (the default), a Span costs one relaxed atomic load; names given as callables are
// not even built.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace hyperpar::profile {

enum Track : int { kMain = 0, kComm = 1 };

struct Event {
  std::string name, category, detail;
  int64_t begin_us, end_us;
  int track;
};

void set_enabled(bool on);
bool enabled();
/// Microseconds on the steady clock (CLOCK_MONOTONIC: one timeline for every process of a
/// host).
int64_t now_us();
void complete(std::string name, const char* category, int64_t begin_us, int64_t end_us,
              int track = kMain, std::string detail = "");
/// Everything recorded since the last take, in recording order.
std::vector<Event> take_events();

class Span {
 public:
  Span(const char* category, std::string name, int track = kMain)
      : on_(enabled()), category_(category), track_(track) {
    if (on_) {
      name_ = std::move(name);
      begin_ = now_us();
    }
  }
  /// name_fn() is called only when profiling is on.
  template <typename F, typename = decltype(std::declval<F>()())>
  Span(const char* category, F name_fn, int track = kMain)
      : on_(enabled()), category_(category), track_(track) {
    if (on_) {
      name_ = name_fn();
      begin_ = now_us();
    }
  }
  ~Span() {
    if (on_) complete(std::move(name_), category_, begin_, now_us(), track_);
  }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

 private:
  bool on_;
  const char* category_;
  int track_;
  std::string name_;
  int64_t begin_ = 0;
};

}  // namespace hyperpar::profile
