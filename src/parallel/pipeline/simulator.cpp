#include "hyperpar/parallel/pipeline/simulator.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <tuple>

namespace hyperpar::parallel::pipeline {
namespace {

using Key = std::tuple<int64_t, ActionType, int64_t>;  // stage, type, microbatch
Key key(int64_t stage, ActionType t, int64_t mb) { return {stage, t, mb}; }

int64_t cost(ActionType t) {
  switch (t) {
    case ActionType::kForward:
    case ActionType::kBackwardInput:
    case ActionType::kBackwardWeight:
      return 1;
    case ActionType::kBackward:
      return 2;
    default:
      return 0;
  }
}

void static_checks(const RankActions& a, const ScheduleSpec& s, std::vector<std::string>& out) {
  const bool split = splits_backward(s.kind);
  const int64_t n = s.stages();
  std::map<Key, int64_t> count;
  for (size_t r = 0; r < a.size(); ++r)
    for (const Action& x : a[r]) {
      if (x.stage < 0 || x.stage >= n || rank_of_stage(x.stage, s.pp) != static_cast<int64_t>(r)) {
        out.push_back("rank " + std::to_string(r) + ": " + to_string(x) +
                      " is not one of its stages");
        continue;
      }
      ++count[key(x.stage, x.type, x.microbatch)];
    }
  auto expect = [&](int64_t st, ActionType t, int64_t mb, int64_t want) {
    const int64_t got = count[key(st, t, mb)];
    if (got != want)
      out.push_back(to_string(Action{st, t, mb}) + " runs " + std::to_string(got) +
                    " times, expected " + std::to_string(want));
  };
  for (int64_t st = 0; st < n; ++st)
    for (int64_t mb = 0; mb < s.microbatches; ++mb) {
      expect(st, ActionType::kForward, mb, 1);
      expect(st, ActionType::kBackward, mb, split ? 0 : 1);
      expect(st, ActionType::kBackwardInput, mb, split ? 1 : 0);
      expect(st, ActionType::kBackwardWeight, mb, split ? 1 : 0);
      // Sends and receives pair up.
      const int64_t sf = count[key(st, ActionType::kSendF, mb)];
      const int64_t rf = st + 1 < n ? count[key(st + 1, ActionType::kRecvF, mb)] : 0;
      if (sf != rf)
        out.push_back(to_string(Action{st, ActionType::kSendF, mb}) + " x" + std::to_string(sf) +
                      " but " + to_string(Action{st + 1, ActionType::kRecvF, mb}) + " x" +
                      std::to_string(rf));
      const int64_t sb = count[key(st, ActionType::kSendB, mb)];
      const int64_t rb = st > 0 ? count[key(st - 1, ActionType::kRecvB, mb)] : 0;
      if (sb != rb)
        out.push_back(to_string(Action{st, ActionType::kSendB, mb}) + " x" + std::to_string(sb) +
                      " but " + to_string(Action{st - 1, ActionType::kRecvB, mb}) + " x" +
                      std::to_string(rb));
    }
  // FSDP: per rank and stage, when the rank uses FSDP actions at all.
  for (size_t r = 0; r < a.size(); ++r) {
    bool fsdp = false;
    for (const Action& x : a[r]) fsdp |= x.type == ActionType::kUnshard;
    if (!fsdp) continue;
    std::map<int64_t, std::vector<size_t>> unshard, reshard, reduce, compute, grads;
    for (size_t i = 0; i < a[r].size(); ++i) {
      const Action& x = a[r][i];
      if (x.type == ActionType::kUnshard) unshard[x.stage].push_back(i);
      if (x.type == ActionType::kReshard) reshard[x.stage].push_back(i);
      if (x.type == ActionType::kReduceGrad) reduce[x.stage].push_back(i);
      if (x.is_compute()) compute[x.stage].push_back(i);
      if (x.type == (split ? ActionType::kBackwardWeight : ActionType::kBackward))
        grads[x.stage].push_back(i);
    }
    for (const auto& [st, idx] : compute) {
      const std::string where = "rank " + std::to_string(r) + " stage " + std::to_string(st);
      if (unshard[st].size() != 1 || reshard[st].size() != 1 || reduce[st].size() != 1) {
        out.push_back(where + ": expected one UNSHARD, one REDUCE_GRAD and one RESHARD");
        continue;
      }
      if (unshard[st][0] > idx.front()) out.push_back(where + ": computes before UNSHARD");
      if (reshard[st][0] < idx.back()) out.push_back(where + ": computes after RESHARD");
      if (reduce[st][0] < grads[st].back())
        out.push_back(where + ": REDUCE_GRAD before the last gradient");
    }
  }
}

}  // namespace

SimulationResult simulate(const RankActions& a, const ScheduleSpec& s) {
  SimulationResult res;
  static_checks(a, s, res.problems);
  if (!res.ok()) return res;
  const int64_t n = s.stages();
  const auto ranks = a.size();
  std::vector<size_t> pc(ranks, 0);
  std::vector<int64_t> clock(ranks, 0);
  res.busy.assign(ranks, 0);
  std::map<Key, int64_t> done;  // compute and send actions -> finish time
  auto finished = [&](int64_t st, ActionType t, int64_t mb) -> const int64_t* {
    auto it = done.find(key(st, t, mb));
    return it == done.end() ? nullptr : &it->second;
  };
  const bool split = splits_backward(s.kind);
  const ActionType grad_in = split ? ActionType::kBackwardInput : ActionType::kBackward;
  std::set<Key> received;
  bool progress = true;
  while (progress) {
    progress = false;
    for (size_t r = 0; r < ranks; ++r) {
      while (pc[r] < a[r].size()) {
        const Action& x = a[r][pc[r]];
        int64_t ready = clock[r];
        bool can = true;
        auto need = [&](const int64_t* t) {
          if (!t)
            can = false;
          else
            ready = std::max(ready, *t);
        };
        auto local_or_received = [&](int64_t from_stage, ActionType t, ActionType via) {
          if (rank_of_stage(from_stage, s.pp) == static_cast<int64_t>(r)) {
            need(finished(from_stage, t, x.microbatch));
          } else if (!received.count(key(x.stage, via, x.microbatch))) {
            can = false;
          }
        };
        switch (x.type) {
          case ActionType::kRecvF:
            need(finished(x.stage - 1, ActionType::kSendF, x.microbatch));
            break;
          case ActionType::kRecvB:
            need(finished(x.stage + 1, ActionType::kSendB, x.microbatch));
            break;
          case ActionType::kSendF:
            need(finished(x.stage, ActionType::kForward, x.microbatch));
            break;
          case ActionType::kSendB:
            need(finished(x.stage, grad_in, x.microbatch));
            break;
          case ActionType::kForward:
            if (x.stage > 0)
              local_or_received(x.stage - 1, ActionType::kForward, ActionType::kRecvF);
            break;
          case ActionType::kBackward:
          case ActionType::kBackwardInput:
            need(finished(x.stage, ActionType::kForward, x.microbatch));
            if (x.stage < n - 1) local_or_received(x.stage + 1, grad_in, ActionType::kRecvB);
            break;
          case ActionType::kBackwardWeight:
            need(finished(x.stage, ActionType::kBackwardInput, x.microbatch));
            break;
          default:
            break;
        }
        if (!can) break;
        clock[r] = ready + cost(x.type);
        res.busy[r] += cost(x.type);
        if (x.type == ActionType::kRecvF || x.type == ActionType::kRecvB)
          received.insert(key(x.stage, x.type, x.microbatch));
        else
          done[key(x.stage, x.type, x.microbatch)] = clock[r];
        ++pc[r];
        progress = true;
      }
    }
  }
  for (size_t r = 0; r < ranks; ++r)
    if (pc[r] < a[r].size())
      res.problems.push_back("deadlock: rank " + std::to_string(r) + " waits forever at " +
                             to_string(a[r][pc[r]]) + " (action " + std::to_string(pc[r]) + ")");
  if (!res.ok()) return res;
  res.makespan = *std::max_element(clock.begin(), clock.end());
  int64_t busy = 0;
  for (int64_t b : res.busy) busy += b;
  res.bubble_fraction =
      res.makespan ? 1.0 - static_cast<double>(busy) /
                               static_cast<double>(res.makespan * static_cast<int64_t>(ranks))
                   : 0;
  return res;
}

std::string describe_schedule(const RankActions& actions, const ScheduleSpec& s) {
  const auto r = simulate(actions, s);
  std::string out = std::string("schedule ") + schedule_name(s.kind) + ": pp " +
                    std::to_string(s.pp) + ", virtual stages " + std::to_string(s.virtual_stages) +
                    ", microbatches " + std::to_string(s.microbatches) + "\n";
  for (size_t i = 0; i < actions.size(); ++i)
    out += "  rank " + std::to_string(i) + ": " + to_string(actions[i]) + "\n";
  if (r.ok()) {
    char buf[160];
    std::snprintf(buf, sizeof(buf),
                  "  valid; bubble fraction %.3f (makespan %lld units, F 1, B 2, I 1, W 1)\n",
                  r.bubble_fraction, static_cast<long long>(r.makespan));
    out += buf;
  } else {
    for (const auto& p : r.problems) out += "  INVALID: " + p + "\n";
  }
  return out;
}

}  // namespace hyperpar::parallel::pipeline
