#include "hyperpar/parallel/pipeline/action.h"

#include <cctype>

#include "hyperpar/core/error.h"

namespace hyperpar::parallel::pipeline {

namespace {
constexpr ActionType kAll[] = {
    ActionType::kForward,        ActionType::kBackward,  ActionType::kBackwardInput,
    ActionType::kBackwardWeight, ActionType::kSendF,     ActionType::kRecvF,
    ActionType::kSendB,          ActionType::kRecvB,     ActionType::kUnshard,
    ActionType::kReshard,        ActionType::kReduceGrad};
}

bool Action::is_compute() const {
  return type == ActionType::kForward || type == ActionType::kBackward ||
         type == ActionType::kBackwardInput || type == ActionType::kBackwardWeight;
}

const char* type_name(ActionType t) {
  switch (t) {
    case ActionType::kForward:
      return "F";
    case ActionType::kBackward:
      return "B";
    case ActionType::kBackwardInput:
      return "I";
    case ActionType::kBackwardWeight:
      return "W";
    case ActionType::kSendF:
      return "SEND_F";
    case ActionType::kRecvF:
      return "RECV_F";
    case ActionType::kSendB:
      return "SEND_B";
    case ActionType::kRecvB:
      return "RECV_B";
    case ActionType::kUnshard:
      return "UNSHARD";
    case ActionType::kReshard:
      return "RESHARD";
    case ActionType::kReduceGrad:
      return "REDUCE_GRAD";
  }
  return "?";
}

std::string to_string(const Action& a) {
  std::string s = std::to_string(a.stage) + type_name(a.type);
  if (a.microbatch >= 0) s += std::to_string(a.microbatch);
  return s;
}

std::string to_string(const std::vector<Action>& actions) {
  std::string s;
  for (const auto& a : actions) s += (s.empty() ? "" : " ") + to_string(a);
  return s;
}

Action parse_action(const std::string& text) {
  size_t i = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
  auto bad = [&] {
    return UsageError("'" + text + "' is not a pipeline action ([stage][type][microbatch], " +
                      "e.g. 0F1, 1B0, 2W3, 0SEND_F1, 0UNSHARD)");
  };
  if (i == 0) throw bad();
  // The longest type name that matches (SEND_F before S..., REDUCE_GRAD before R...).
  const ActionType* best = nullptr;
  size_t best_len = 0;
  for (const auto& t : kAll) {
    const std::string n = type_name(t);
    if (text.compare(i, n.size(), n) == 0 && n.size() > best_len) {
      best = &t;
      best_len = n.size();
    }
  }
  if (!best) throw bad();
  Action a;
  a.stage = std::stoll(text.substr(0, i));
  a.type = *best;
  const std::string rest = text.substr(i + best_len);
  for (char c : rest)
    if (!std::isdigit(static_cast<unsigned char>(c))) throw bad();
  a.microbatch = rest.empty() ? -1 : std::stoll(rest);
  const bool needs_mb = a.type != ActionType::kUnshard && a.type != ActionType::kReshard &&
                        a.type != ActionType::kReduceGrad;
  if (needs_mb != (a.microbatch >= 0)) throw bad();
  return a;
}

}  // namespace hyperpar::parallel::pipeline
