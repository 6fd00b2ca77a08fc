#pragma once
// A byte count from an environment variable, one parser for every such setting of comm/
// (HYPERPAR_SHM_ARENA_BYTES, HYPERPAR_<BACKEND>_SHM_BYTES, HYPERPAR_SHM_PEER_PAGES_BYTES):
// digits only, no units, in range; 0 only where it means something (internal to comm/).
//
//   env_byte_count("HYPERPAR_SHM_ARENA_BYTES", "turns the arena off")  // 0 allowed
//   env_byte_count("HYPERPAR_MPI_SHM_BYTES")                           // positive only
//   // "HYPERPAR_MPI_SHM_BYTES must be a positive byte count, got '64MB'"
#include <cstddef>
#include <optional>
#include <string>

namespace hyperpar::comm {

/// The value of `name`, or nothing when it is unset or empty. Throws hyperpar::Error naming
/// the variable and quoting the value when it is not a byte count, or is 0 and
/// `zero_means` is null (where it is not, 0 is allowed and the message says what it does).
std::optional<size_t> env_byte_count(const std::string& name, const char* zero_means = nullptr);

}  // namespace hyperpar::comm
