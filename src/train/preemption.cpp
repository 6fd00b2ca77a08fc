#include "hyperpar/train/preemption.h"

#include <signal.h>

namespace hyperpar::train {
namespace {
volatile sig_atomic_t g_signal = 0;
void on_signal(int sig) {
  if (g_signal == 0) g_signal = sig;
  signal(sig, SIG_DFL);  // a second one ends the process
}
}  // namespace

void install_preemption_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

int preemption_signal() { return g_signal; }

}  // namespace hyperpar::train
