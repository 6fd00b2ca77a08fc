#pragma once
// One step of a pipeline schedule, in PyTorch's torch.distributed.pipelining notation:
// [stage][type][microbatch], e.g. "0F1" (stage 0, forward of microbatch 1), "1B0" (full
// backward), "2I3" / "2W3" (backward for inputs / for weights, zero-bubble schedules),
// "0SEND_F1" (stage 0 sends microbatch 1's output to stage 1), "1RECV_F1" (stage 1 receives
// it), "1SEND_B0" / "0RECV_B0" (the input gradient going back), "0UNSHARD", "0RESHARD",
// "0REDUCE_GRAD" (FSDP on the stage's parameters; no microbatch).
//
//   Action a = parse_action("3SEND_B12");   // {3, kSendB, 12}
//   to_string(a) == "3SEND_B12"
#include <cstdint>
#include <string>
#include <vector>

namespace hyperpar::parallel::pipeline {

enum class ActionType {
  kForward,         // F
  kBackward,        // B: input and weight gradients together
  kBackwardInput,   // I
  kBackwardWeight,  // W
  kSendF,
  kRecvF,
  kSendB,
  kRecvB,
  kUnshard,
  kReshard,
  kReduceGrad,
};

struct Action {
  int64_t stage = 0;
  ActionType type = ActionType::kForward;
  int64_t microbatch = -1;  // -1: none (UNSHARD, RESHARD, REDUCE_GRAD)
  bool operator==(const Action& o) const {
    return stage == o.stage && type == o.type && microbatch == o.microbatch;
  }
  bool is_compute() const;
};

const char* type_name(ActionType t);  // "F", "SEND_F", ...
std::string to_string(const Action& a);
std::string to_string(const std::vector<Action>& actions);  // space separated
/// Throws UsageError for text that is not one action.
Action parse_action(const std::string& text);

/// A schedule: for each pipeline rank, its actions in order.
using RankActions = std::vector<std::vector<Action>>;

}  // namespace hyperpar::parallel::pipeline
