#pragma once
// Every rank's string on group rank 0 (reports, traces): two all-gathers over `group`, of the
// lengths and of the strings padded to the longest. Collective: every group rank calls it.
//   auto all = comm::gather_strings(*world_group, my_json);  // rank 0: one per rank; else {}
#include <string>
#include <vector>

#include "hyperpar/comm/communicator.h"

namespace hyperpar::comm {

std::vector<std::string> gather_strings(Communicator& group, const std::string& mine);

}  // namespace hyperpar::comm
