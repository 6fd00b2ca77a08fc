#pragma once
// LocalExchange: the rings' set-up exchange (ShmRing::Exchange) between the threads of one
// process, one thread per rank; `host_override` pretends a rank is on another host.
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "../src/comm/shm_ring.h"

namespace hyperpar::comm::testing {

// A blocking all-gather of strings between the threads of one process.
class LocalExchange {
 public:
  explicit LocalExchange(int64_t n) : n_(n) {}
  ShmRing::Exchange for_rank(int64_t r, std::string host_override = "") {
    return [this, r, host_override](const std::string& mine, int round) {
      std::string v = mine;
      if (round == 0 && !host_override.empty()) v = host_override + v.substr(v.find('\n'));
      std::unique_lock<std::mutex> lock(m_);
      values_[{round, r}] = v;
      cv_.notify_all();
      cv_.wait(lock, [&] {
        for (int64_t q = 0; q < n_; ++q)
          if (!values_.count({round, q})) return false;
        return true;
      });
      std::vector<std::string> all;
      for (int64_t q = 0; q < n_; ++q) all.push_back(values_[{round, q}]);
      return all;
    };
  }

 private:
  int64_t n_;
  std::mutex m_;
  std::condition_variable cv_;
  std::map<std::pair<int, int64_t>, std::string> values_;
};

}  // namespace hyperpar::comm::testing
