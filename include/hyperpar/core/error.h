#pragma once
// hyperpar's error type and check macro. Library code never aborts or exits: it throws
// hyperpar::Error (or a subclass) whose message shows the values involved.
//
//   HP_CHECK(n > 0, "mesh dim size must be positive, got ", n);
#include <sstream>
#include <stdexcept>
#include <string>

namespace hyperpar {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A collective was called with a buffer that breaks the communication contract
/// (DESIGN.md invariant 2). Thrown synchronously at the call site.
class ContractError : public Error {
 public:
  using Error::Error;
};

/// Bad input from the user (a config, a command line, a layout that cannot fit): reported
/// before any work starts; programs exit with code 2.
class UsageError : public Error {
 public:
  using Error::Error;
};

/// A collective failed because a peer did (its connection closed, it exited): a consequence
/// of another rank's failure, which the launcher names instead of this one.
class PeerError : public Error {
 public:
  using Error::Error;
};

namespace detail {
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

}  // namespace hyperpar

#define HP_CHECK(cond, ...)                                                        \
  do {                                                                             \
    if (!(cond)) throw ::hyperpar::Error(::hyperpar::detail::concat(__VA_ARGS__)); \
  } while (0)
