#include "hyperpar/parallel/pipeline/lowering.h"

#include <map>
#include <set>

namespace hyperpar::parallel::pipeline {

RankActions add_communication(const RankActions& compute, const ScheduleSpec& s) {
  const int64_t n = s.stages();
  RankActions out(compute.size());
  for (size_t r = 0; r < compute.size(); ++r) {
    for (const Action& a : compute[r]) {
      const bool fwd = a.type == ActionType::kForward;
      const bool grad_in = a.type == ActionType::kBackward || a.type == ActionType::kBackwardInput;
      // Receive what this compute needs from a stage on another rank.
      if (fwd && a.stage > 0 && rank_of_stage(a.stage - 1, s.pp) != static_cast<int64_t>(r))
        out[r].push_back({a.stage, ActionType::kRecvF, a.microbatch});
      if (grad_in && a.stage < n - 1 && rank_of_stage(a.stage + 1, s.pp) != static_cast<int64_t>(r))
        out[r].push_back({a.stage, ActionType::kRecvB, a.microbatch});
      out[r].push_back(a);
      if (fwd && a.stage < n - 1 && rank_of_stage(a.stage + 1, s.pp) != static_cast<int64_t>(r))
        out[r].push_back({a.stage, ActionType::kSendF, a.microbatch});
      if (grad_in && a.stage > 0 && rank_of_stage(a.stage - 1, s.pp) != static_cast<int64_t>(r))
        out[r].push_back({a.stage, ActionType::kSendB, a.microbatch});
    }
  }
  return out;
}

RankActions add_fsdp(const RankActions& actions, const ScheduleSpec& s) {
  const bool split = splits_backward(s.kind);
  const ActionType last_grad = split ? ActionType::kBackwardWeight : ActionType::kBackward;
  RankActions out(actions.size());
  for (size_t r = 0; r < actions.size(); ++r) {
    std::map<int64_t, int64_t> grads_left;  // stage -> weight-gradient computes still to come
    for (const Action& a : actions[r])
      if (a.type == last_grad) ++grads_left[a.stage];
    std::set<int64_t> unsharded;
    for (const Action& a : actions[r]) {
      // Before anything of the stage (its first receive too, so the gather overlaps it).
      if (!unsharded.count(a.stage)) {
        out[r].push_back({a.stage, ActionType::kUnshard, -1});
        unsharded.insert(a.stage);
      }
      out[r].push_back(a);
      if (a.type == last_grad && --grads_left[a.stage] == 0) {
        out[r].push_back({a.stage, ActionType::kReduceGrad, -1});
        out[r].push_back({a.stage, ActionType::kReshard, -1});
      }
    }
  }
  return out;
}

RankActions lowered_schedule(const ScheduleSpec& s, bool with_fsdp) {
  RankActions a = add_communication(compute_schedule(s), s);
  return with_fsdp ? add_fsdp(a, s) : a;
}

}  // namespace hyperpar::parallel::pipeline
