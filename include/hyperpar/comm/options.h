#pragma once
// Options for collectives (one struct, so that adding a field changes no signature).
#include <string>

namespace hyperpar::comm {

enum class ReduceOp { kSum, kAvg, kMax, kMin };
const char* to_string(ReduceOp op);

struct CollectiveOptions {
  /// Caller's tag, printed in contract errors (FSDP passes the parameter FQNs).
  std::string tag;
  /// false: the call returns after wait(); true: the returned Work must be waited on.
  bool async_op = false;
};

}  // namespace hyperpar::comm
