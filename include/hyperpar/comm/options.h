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
  /// send/recv: matches a send with the recv of the same tag between the same two ranks
  /// (pipelines tag each message by stage, microbatch and direction). 0 .. 2^24 - 1.
  int64_t message_tag = 0;
};

}  // namespace hyperpar::comm
