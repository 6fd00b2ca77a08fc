#pragma once
// A program stopping on request (e.g. preempted after saving a checkpoint), not failing:
// run_main prints the message and exits with `exit_code` (128 + signal for a signal),
// recording the ending as kind "stopped" for the launcher.
#include <stdexcept>
#include <string>

namespace hyperpar {

class StopRequest : public std::runtime_error {
 public:
  StopRequest(int exit_code, const std::string& what)
      : std::runtime_error(what), exit_code(exit_code) {}
  int exit_code;
};

}  // namespace hyperpar
