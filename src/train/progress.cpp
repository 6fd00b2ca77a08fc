#include "hyperpar/train/progress.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "hyperpar/train/trainer.h"

namespace hyperpar::train {

ProgressPrinter::ProgressPrinter(int64_t total_steps, bool live)
    : total_(total_steps), live_(live) {}

bool ProgressPrinter::console_is_terminal() {
  const char* env = std::getenv("HYPERPAR_CONSOLE_TTY");
  return isatty(STDOUT_FILENO) || (env && std::string(env) == "1");
}

void ProgressPrinter::step(const StepMetrics& m) {
  seconds_ += m.step_time_s;
  ++printed_;
  char val[48] = "";
  if (std::isfinite(m.val_loss)) std::snprintf(val, sizeof(val), "  val_loss %.6f", m.val_loss);
  if (!live_) {
    std::printf("step %4lld  loss %.6f%s  grad_norm %.4f  lr %.2e  tokens/s %.0f  time %.3fs\n",
                static_cast<long long>(m.step), m.loss, val, m.grad_norm, m.lr, m.tokens_per_s,
                m.step_time_s);
    std::fflush(stdout);
    return;
  }
  constexpr int kWidth = 20;
  const double frac = total_ > 0 ? static_cast<double>(m.step) / static_cast<double>(total_) : 1;
  std::string bar(kWidth, '.');
  for (int i = 0; i < static_cast<int>(frac * kWidth); ++i) bar[i] = '#';
  const double per_step = seconds_ / static_cast<double>(printed_);  // also after a resume
  const long long eta =
      static_cast<long long>(per_step * static_cast<double>(total_ - m.step) + 0.5);
  std::printf(
      "\r\x1b[Kstep %lld/%lld [%s] %3.0f%%  loss %.6f%s  grad_norm %.4f  lr %.2e  "
      "%.0f tok/s  %.2f s/step  ETA %lld:%02lld:%02lld",
      static_cast<long long>(m.step), static_cast<long long>(total_), bar.c_str(), frac * 100,
      m.loss, val, m.grad_norm, m.lr, m.tokens_per_s, m.step_time_s, eta / 3600, eta / 60 % 60,
      eta % 60);
  std::fflush(stdout);
  drawn_ = true;
}

void ProgressPrinter::finish() {
  if (live_ && drawn_) std::printf("\n");
  std::fflush(stdout);
  drawn_ = false;
}

}  // namespace hyperpar::train
