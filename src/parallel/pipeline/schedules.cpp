#include "hyperpar/parallel/pipeline/schedules.h"

#include <algorithm>
#include <deque>
#include <map>

#include "hyperpar/core/error.h"

namespace hyperpar::parallel::pipeline {

ScheduleKind parse_schedule(const std::string& name, const std::string& key) {
  if (name == "GPipe" || name == "gpipe") return ScheduleKind::kGPipe;
  if (name == "1F1B" || name == "1f1b") return ScheduleKind::k1F1B;
  if (name == "Interleaved1F1B" || name == "interleaved_1f1b")
    return ScheduleKind::kInterleaved1F1B;
  if (name == "InterleavedZeroBubble" || name == "ZBH1" || name == "zb_h1")
    return ScheduleKind::kInterleavedZeroBubble;
  throw UsageError(key + " must be GPipe, 1F1B, Interleaved1F1B or InterleavedZeroBubble, got '" +
                   name + "'");
}

const char* schedule_name(ScheduleKind k) {
  switch (k) {
    case ScheduleKind::kGPipe:
      return "GPipe";
    case ScheduleKind::k1F1B:
      return "1F1B";
    case ScheduleKind::kInterleaved1F1B:
      return "Interleaved1F1B";
    case ScheduleKind::kInterleavedZeroBubble:
      return "InterleavedZeroBubble";
  }
  return "?";
}

bool splits_backward(ScheduleKind k) { return k == ScheduleKind::kInterleavedZeroBubble; }

void check_schedule(const ScheduleSpec& s, int64_t n_layers) {
  const std::string name = schedule_name(s.kind);
  auto fail = [&](const std::string& why) { throw UsageError("pipeline (" + name + "): " + why); };
  if (s.pp < 1 || s.virtual_stages < 1 || s.microbatches < 1)
    fail("parallel.pp (" + std::to_string(s.pp) + "), parallel.pp_virtual_stages (" +
         std::to_string(s.virtual_stages) + ") and parallel.pp_microbatches (" +
         std::to_string(s.microbatches) + ") must be >= 1");
  if ((s.kind == ScheduleKind::kGPipe || s.kind == ScheduleKind::k1F1B) && s.virtual_stages != 1)
    fail("runs one stage per rank, got parallel.pp_virtual_stages " +
         std::to_string(s.virtual_stages) + " (use Interleaved1F1B or InterleavedZeroBubble)");
  if (s.kind == ScheduleKind::kInterleaved1F1B || s.kind == ScheduleKind::kInterleavedZeroBubble) {
    const int64_t rounds = std::max<int64_t>(1, s.microbatches / s.pp);
    if (s.microbatches % rounds)
      fail("parallel.pp_microbatches " + std::to_string(s.microbatches) +
           " must be a multiple of its rounds max(1, microbatches / pp) = " +
           std::to_string(rounds) + " (pp " + std::to_string(s.pp) + ")");
  }
  if (n_layers >= 0 && n_layers < s.stages())
    fail("model.n_layers " + std::to_string(n_layers) +
         " is fewer than the pp x virtual stages = " + std::to_string(s.stages()) + " stages");
}

namespace {

// The 1F1B family on one rank: `warmup` forwards, then forward/backward pairs, then the
// remaining backwards; forward k runs local stage fwd_local(k), backward k bwd_local(k).
// Zero bubble: backward is I, and W of the oldest pending I follows each I from the
// (delay+1)-th pair on; the rest at the end.
std::vector<Action> one_f_one_b_family(const ScheduleSpec& s, int64_t rank, int64_t warmup,
                                       bool zero_bubble, int64_t delay) {
  const int64_t pp = s.pp, v = s.virtual_stages, m = s.microbatches;
  const int64_t per_round = m / std::max<int64_t>(1, m / pp);
  const int64_t total = m * v;
  warmup = std::min(warmup, total);
  std::map<int64_t, int64_t> next_f, next_b, next_w;
  std::deque<int64_t> pending_w;  // stages of I's whose W has not run, oldest first
  std::vector<Action> out;
  auto forward = [&](int64_t k) {
    const int64_t stage = ((k / per_round) % v) * pp + rank;
    out.push_back({stage, ActionType::kForward, next_f[stage]++});
  };
  auto backward = [&](int64_t k) {
    const int64_t stage = (v - 1 - (k / per_round) % v) * pp + rank;
    out.push_back(
        {stage, zero_bubble ? ActionType::kBackwardInput : ActionType::kBackward, next_b[stage]++});
    if (zero_bubble) pending_w.push_back(stage);
  };
  auto weight = [&] {
    const int64_t stage = pending_w.front();
    pending_w.pop_front();
    out.push_back({stage, ActionType::kBackwardWeight, next_w[stage]++});
  };
  for (int64_t k = 0; k < warmup; ++k) forward(k);
  for (int64_t j = 0; j < total; ++j) {  // j-th backward
    if (warmup + j < total) forward(warmup + j);
    backward(j);
    if (zero_bubble && j >= delay) weight();
  }
  while (!pending_w.empty()) weight();
  return out;
}

}  // namespace

RankActions compute_schedule(const ScheduleSpec& s) {
  check_schedule(s);
  RankActions out(s.pp);
  const int64_t v = s.virtual_stages, m = s.microbatches;
  const int64_t per_round = m / std::max<int64_t>(1, m / s.pp);
  for (int64_t r = 0; r < s.pp; ++r) {
    switch (s.kind) {
      case ScheduleKind::kGPipe:
        for (int64_t i = 0; i < m; ++i) out[r].push_back({r, ActionType::kForward, i});
        for (int64_t i = 0; i < m; ++i) out[r].push_back({r, ActionType::kBackward, i});
        break;
      case ScheduleKind::k1F1B:
        out[r] = one_f_one_b_family(s, r, s.pp - 1 - r, false, 0);
        break;
      case ScheduleKind::kInterleaved1F1B:
        out[r] = one_f_one_b_family(s, r, (v - 1) * per_round + 2 * (s.pp - 1 - r), false, 0);
        break;
      case ScheduleKind::kInterleavedZeroBubble:
        out[r] = one_f_one_b_family(s, r, (v - 1) * per_round + (s.pp - 1 - r), true, r);
        break;
    }
  }
  return out;
}

}  // namespace hyperpar::parallel::pipeline
