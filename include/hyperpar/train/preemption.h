#pragma once
// Preemption: SIGTERM or SIGINT to a worker (a scheduler's preemption, or the launcher
// forwarding one) asks training to stop at the end of the current step. Ranks may get the
// signal at different times, so the request travels with the step's loss all-reduce: every
// rank sees it in the same step, saves a checkpoint and throws Preempted; run_main then exits
// with 128 + signal. A second signal ends the process at once (default action).
#include <string>

#include "hyperpar/core/stop_request.h"

namespace hyperpar::train {

/// Installs the handlers (idempotent).
void install_preemption_handlers();
/// The signal received so far (0: none).
int preemption_signal();

class Preempted : public StopRequest {
 public:
  Preempted(int sig, const std::string& what) : StopRequest(128 + sig, what), signal(sig) {}
  int signal;
};

}  // namespace hyperpar::train
