#include "hyperpar/parallel/pipeline/stage_split.h"

#include "hyperpar/core/error.h"
#include "hyperpar/core/format.h"

namespace hyperpar::parallel::pipeline {

std::vector<StageLayers> split_layers(int64_t n_layers, int64_t n_stages,
                                      const std::vector<int64_t>& first_layers,
                                      const std::string& key) {
  if (n_stages < 1 || n_layers < n_stages)
    throw UsageError(detail::concat("pipeline: ", n_layers, " layers cannot fill ", n_stages,
                                    " stages (pp x pp_virtual_stages); every stage needs a layer"));
  std::vector<int64_t> firsts = first_layers;
  if (firsts.empty()) {
    for (int64_t s = 0; s < n_stages; ++s) firsts.push_back(s * n_layers / n_stages);
  } else {
    if (static_cast<int64_t>(firsts.size()) != n_stages)
      throw UsageError(detail::concat(key, " lists ", firsts.size(), " first layers ",
                                      format_list(firsts), "; expected one per stage (", n_stages,
                                      ")"));
    if (firsts[0] != 0)
      throw UsageError(detail::concat(key, " ", format_list(firsts),
                                      " must start at layer 0 (the first stage's first layer)"));
    for (size_t s = 1; s < firsts.size(); ++s)
      if (firsts[s] <= firsts[s - 1] || firsts[s] >= n_layers)
        throw UsageError(detail::concat(key, " ", format_list(firsts),
                                        " must be strictly increasing and below n_layers ",
                                        n_layers, " (every stage holds at least one layer)"));
  }
  std::vector<StageLayers> out;
  for (int64_t s = 0; s < n_stages; ++s) {
    StageLayers st;
    st.first = firsts[s];
    st.end = s + 1 < n_stages ? firsts[s + 1] : n_layers;
    st.embedding = s == 0;
    st.head = s + 1 == n_stages;
    out.push_back(st);
  }
  return out;
}

std::vector<int64_t> layers_of_rank(const std::vector<StageLayers>& stages, int64_t rank,
                                    int64_t pp) {
  std::vector<int64_t> out;
  for (size_t s = static_cast<size_t>(rank); s < stages.size(); s += static_cast<size_t>(pp))
    for (int64_t l = stages[s].first; l < stages[s].end; ++l) out.push_back(l);
  return out;
}

}  // namespace hyperpar::parallel::pipeline
