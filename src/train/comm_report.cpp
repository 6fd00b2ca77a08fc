#include "hyperpar/train/comm_report.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "hyperpar/comm/gather_strings.h"

namespace hyperpar::train {

namespace {

void add_bound(comm::TrafficTable& t, const std::string& scope, const std::string& op,
               double bytes) {
  auto& c = t[{scope, op}];
  c.bound += bytes;
  c.bounded = true;
}

void add_tp_bounds(comm::TrafficTable& t, const Config& c, const ParallelModel& pm) {
  const int64_t tp = c.parallel.tp;
  if (tp <= 1) return;
  const auto& m = c.model;
  const auto& model = *pm.model;
  const double f = static_cast<double>(tp - 1) / static_cast<double>(tp);
  const double b = static_cast<double>(c10::elementSize(c.parallel.param_dtype));
  const double rows = static_cast<double>(c.train.global_batch_size / pm.dp_size);
  const double tokens = rows * static_cast<double>(c.train.seq_len);
  const double x = tokens * static_cast<double>(m.dim) * b;
  const bool sp = c.parallel.sequence_parallel;
  // Norm weights under sequence parallel: their gradient is all-reduced per backward.
  const double backwards = static_cast<double>(
      c.train.micro_batches * (c.parallel.pp > 1 ? c.parallel.pp_microbatches : 1));
  const double norm_ar = backwards * 2 * f * static_cast<double>(m.dim) * b;
  for (int64_t l : model.layer_ids) {
    if (m.is_moe_layer(l)) continue;
    const std::string scope = "tp layers." + std::to_string(l);
    if (sp) {
      add_bound(t, scope, "all_gather_into_tensor", 4 * f * x);
      add_bound(t, scope, "reduce_scatter_tensor", 4 * f * x);
      add_bound(t, scope, "all_reduce", 2 * norm_ar);
    } else {
      add_bound(t, scope, "all_reduce", 8 * f * x);
    }
  }
  if (model.tok_embeddings) {
    if (sp) {  // reduce-scatter forward, its gradient all-gathered
      add_bound(t, "tp tok_embeddings", "reduce_scatter_tensor", f * x);
      add_bound(t, "tp tok_embeddings", "all_gather_into_tensor", f * x);
    } else {
      add_bound(t, "tp tok_embeddings", "all_reduce", 2 * f * x);
    }
  }
  if (model.output) {
    // The logits gathered for the loss, or with loss parallel 3 float32 per row all-reduced
    // (row max; sum of exponentials and target logit, parallel/loss_parallel.h).
    const double logits = c.parallel.loss_parallel ? 0.0 : tokens * m.vocab_size * b;
    if (c.parallel.loss_parallel) add_bound(t, "tp output", "all_reduce", 2 * f * 3 * tokens * 4);
    if (sp) {
      add_bound(t, "tp output", "all_gather_into_tensor", f * x + f * logits);
      add_bound(t, "tp output", "reduce_scatter_tensor", f * x);
      add_bound(t, "tp norm", "all_reduce", norm_ar);
    } else {
      add_bound(t, "tp output", "all_reduce", 2 * f * x);
      if (logits > 0) add_bound(t, "tp output", "all_gather_into_tensor", f * logits);
    }
  }
}

void accumulate(comm::TrafficTable& into, const comm::TrafficTable& from) {
  for (const auto& [key, c] : from) {
    auto& d = into[key];
    d.calls += c.calls;
    d.bytes += c.bytes;
    d.bound += c.bound;
    d.bounded = d.bounded || c.bounded;
  }
}

std::string human_bytes(double v) {
  char buf[32];
  if (v >= 1e9)
    std::snprintf(buf, sizeof(buf), "%.3f GB", v / 1e9);
  else if (v >= 1e6)
    std::snprintf(buf, sizeof(buf), "%.3f MB", v / 1e6);
  else if (v >= 1e3)
    std::snprintf(buf, sizeof(buf), "%.3f kB", v / 1e3);
  else
    std::snprintf(buf, sizeof(buf), "%.0f B", v);
  return buf;
}

}  // namespace

comm::TrafficTable layout_traffic_bounds(const Config& c, const ParallelModel& pm) {
  comm::TrafficTable t;
  const bool pipelined = c.parallel.pp > 1;
  for (const auto& h : pm.fsdp) {
    const auto b = h.traffic_lower_bound(pipelined ? 1 : c.train.micro_batches, pipelined);
    for (const auto& [op, bytes] : b.bytes_per_op) add_bound(t, b.scope, op, bytes);
  }
  add_tp_bounds(t, c, pm);
  return t;
}

CommReport::CommReport(const Config& c, const ParallelModel& pm)
    : bounds_(layout_traffic_bounds(c, pm)) {}

void CommReport::begin_step() {
  comm::set_traffic_recording(true);
  comm::take_traffic();  // start-up, evaluation: not part of a step
}

double CommReport::end_step() {
  comm::TrafficTable step = comm::take_traffic();
  double bytes = 0;
  for (const auto& [key, c] : step) bytes += c.bytes;
  ++steps_;
  if (steps_ == 1)
    first_ = std::move(step);
  else
    accumulate(sum_, step);
  return bytes;
}

std::string CommReport::finish(comm::Communicator& world, bool print) {
  comm::set_traffic_recording(false);
  // Per step: the mean over the steps after the first, or the first if it is the only one.
  const comm::TrafficTable& counted = steps_ > 1 ? sum_ : first_;
  const double n = std::max<double>(1, static_cast<double>(steps_ > 1 ? steps_ - 1 : steps_));
  comm::TrafficTable table = bounds_;  // per step; groups with a bound appear even if silent
  for (const auto& [key, c] : counted) {
    auto& d = table[key];
    d.calls += c.calls;  // divided by n below
    d.bytes += c.bytes / n;
    d.bound += c.bound / n;
    d.bounded = d.bounded || c.bounded;
  }
  nlohmann::json groups = nlohmann::json::array();
  for (const auto& [key, c] : table) {
    nlohmann::json g = {{"group", key.first},
                        {"op", key.second},
                        {"calls", static_cast<double>(c.calls) / n},
                        {"bytes", c.bytes}};
    if (c.bounded) {
      g["bound"] = c.bound;
      g["ratio"] = c.bound > 0 ? nlohmann::json(c.bytes / c.bound) : nlohmann::json();
    }
    groups.push_back(g);
  }
  const std::string mine = nlohmann::json({{"rank", world.ranks()[world.rank()]},
                                           {"steps", steps_ > 1 ? steps_ - 1 : steps_},
                                           {"groups", groups}})
                               .dump();
  const auto all = comm::gather_strings(world, mine);
  if (world.rank() != 0) return "";
  nlohmann::json ranks = nlohmann::json::array();
  for (const auto& r : all) ranks.push_back(nlohmann::json::parse(r));
  double worst = 0;
  std::string worst_at;
  for (const auto& rk : ranks)
    for (const auto& g : rk["groups"])
      if (g.contains("ratio") && g["ratio"].is_number() && g["ratio"].get<double>() > worst) {
        worst = g["ratio"].get<double>();
        worst_at = g["group"].get<std::string>() + " " + g["op"].get<std::string>() + " on rank " +
                   std::to_string(rk["rank"].get<int64_t>());
      }
  nlohmann::json report = {{"ranks", ranks}, {"worst_ratio", worst}, {"worst_at", worst_at}};
  if (print) {
    std::printf(
        "comm report: per step (mean over %lld step(s) after the first), bytes this rank "
        "sends; bound: the least its layout needs; ratio = bytes / bound\n",
        static_cast<long long>(ranks[0]["steps"].get<int64_t>()));
    for (const auto& rk : ranks) {
      std::printf("rank %lld\n", static_cast<long long>(rk["rank"].get<int64_t>()));
      std::printf("  %-32s %-24s %7s %12s %12s %7s\n", "group", "op", "calls", "bytes", "bound",
                  "ratio");
      for (const auto& g : rk["groups"]) {
        const bool has = g.contains("ratio") && g["ratio"].is_number();
        char ratio[16] = "-";
        if (has) std::snprintf(ratio, sizeof(ratio), "%.4f", g["ratio"].get<double>());
        std::printf("  %-32s %-24s %7.2f %12s %12s %7s\n", g["group"].get<std::string>().c_str(),
                    g["op"].get<std::string>().c_str(), g["calls"].get<double>(),
                    human_bytes(g["bytes"].get<double>()).c_str(),
                    g.contains("bound") ? human_bytes(g["bound"].get<double>()).c_str() : "-",
                    ratio);
      }
    }
    std::printf("comm report: worst bytes / bound %.4f (%s)\n", worst, worst_at.c_str());
    std::fflush(stdout);
  }
  return report.dump();
}

}  // namespace hyperpar::train
