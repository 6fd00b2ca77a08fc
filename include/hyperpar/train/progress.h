#pragma once
// What rank 0 shows per step. On a terminal (stdout is a TTY, or the launcher says its
// console is one: HYPERPAR_CONSOLE_TTY=1) a live line redrawn in place, torchtitan/tqdm
// style:
//   step 12/20 [##########......] 60%  loss 4.123456  grad_norm 0.5312  lr 3.00e-03
//   5120 tok/s  0.21 s/step  ETA 0:00:02
// Without a terminal, one plain line per step, as log files and CI want:
//   step   12  loss 4.123456  grad_norm 0.5312  lr 3.00e-03  tokens/s 5120  time 0.210s
// On evaluation steps "val_loss 4.2" follows the loss.
// (No C++ progress-bar library is packaged for Debian; this is the one line hyperpar needs.)
#include <cstdint>

namespace hyperpar::train {

struct StepMetrics;

class ProgressPrinter {
 public:
  ProgressPrinter(int64_t total_steps, bool live);
  /// Console is a terminal (stdout, or the launcher's console through the environment).
  static bool console_is_terminal();
  void step(const StepMetrics& m);
  /// Ends a live line (newline), so that whatever follows starts on its own line.
  void finish();

 private:
  int64_t total_;
  bool live_;
  bool drawn_ = false;
  double seconds_ = 0;
  int64_t printed_ = 0;
};

}  // namespace hyperpar::train
