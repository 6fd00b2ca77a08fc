#include "hyperpar/train/trainer.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <optional>

#include "hyperpar/comm/traffic.h"
#include "hyperpar/comm/watchdog.h"
#include "hyperpar/core/cpu_time.h"
#include "hyperpar/core/process_memory.h"
#include "hyperpar/core/profiler.h"
#include "hyperpar/nn/safetensors.h"
#include "hyperpar/optim/optimizer.h"
#include "hyperpar/train/checkpointing.h"
#include "hyperpar/train/comm_report.h"
#include "hyperpar/train/pipeline_setup.h"
#include "hyperpar/train/preemption.h"
#include "hyperpar/train/profile_trace.h"
#include "hyperpar/train/progress.h"

namespace hyperpar::train {

double peak_rss_mb() { return peak_resident_mb(); }

namespace {

// Rows [first, first + n) of the step's batch, with hyperpar's logits, for comparison with
// another implementation (TrainOptions::dump_first_batch).
void dump_rows(const std::string& dir, int64_t first, const data::Batch& b,
               const at::Tensor& logits) {
  std::filesystem::create_directories(dir);
  nn::write_safetensors_file(dir + "/rows-" + std::to_string(first) + ".safetensors",
                             {{"tokens", b.tokens.contiguous()},
                              {"targets", b.targets.contiguous()},
                              {"logits", logits.detach().to(at::kFloat).contiguous()}},
                             {{"first_row", std::to_string(first)}}, false);
}

}  // namespace

TrainResult run_training(const Config& c, ParallelModel& pm, comm::World& world,
                         const TrainOptions& o) {
  const std::string& metrics_path = o.metrics_path;
  const bool print = o.print;
  const auto& t = c.train;
  std::optional<data::DataLoader> own_data;
  if (!o.data)
    own_data.emplace(c.data, t.seq_len, c.model.vocab_size, t.global_batch_size, t.seed,
                     t.eval_interval > 0 ? t.eval_batches : 0);
  data::DataLoader& data = o.data ? *o.data : *own_data;
  auto& model = *pm.model;
  std::vector<nn::Parameter*> params;
  for (auto& [n, p] : model.named_parameters()) params.push_back(p);
  std::unique_ptr<optim::Optimizer> opt;
  if (t.optimizer == "sgd")
    opt = std::make_unique<optim::SGD>(params, t.lr, 0.9, t.weight_decay);
  else
    opt = std::make_unique<optim::AdamW>(params, t.lr, t.weight_decay);
  TrainResult result;
  TrainCheckpointer ckpt(c, pm, *opt, world, data);
  if (!c.checkpoint.dir.empty()) install_preemption_handlers();
  const int64_t resumed = ckpt.resume();
  result.resumed_from_step = resumed;
  std::ofstream metrics;
  if (!metrics_path.empty() && world.rank() == 0) {
    // A resumed run continues the metrics of the run it resumes.
    metrics.open(metrics_path, resumed > 0 ? std::ios::app : std::ios::trunc);
    HP_CHECK(metrics.is_open(), "--metrics ", metrics_path, ": cannot open for writing");
  }
  ProgressPrinter progress(t.steps, ProgressPrinter::console_is_terminal());
  std::vector<int64_t> all(world.size());
  std::iota(all.begin(), all.end(), 0);
  auto world_group = world.group(all, "world");
  const int64_t local_rows = t.global_batch_size / pm.dp_size;
  const int64_t micro_rows = local_rows / t.micro_batches;
  // --dump-first-batch: the first tp rank of each tp group writes its rows' whole logits.
  const bool dump = !o.dump_first_batch.empty();
  // Pipeline parallelism: each micro-batch is split again into pp_microbatches that the
  // schedule runs; only the last stage's ranks see the loss, so their sums count pp times in
  // the world average below (the others contribute 0).
  const int64_t pp = c.parallel.pp;
  std::unique_ptr<parallel::pipeline::PipelineRuntime> pipeline;
  if (pp > 1) {
    if (!o.dump_first_batch.empty())
      throw UsageError("--dump-first-batch needs the whole model on each rank (parallel.pp = 1)");
    pipeline = make_pipeline(c, pm);
  }
  const int64_t pp_microbatches = pp > 1 ? c.parallel.pp_microbatches : 1;
  const int64_t pp_rows = micro_rows / pp_microbatches;
  const double loss_weight = pp > 1 && pipeline->holds_last_stage() ? static_cast<double>(pp)
                             : pp > 1                               ? 0.0
                                                                    : 1.0;
  // A pipeline's microbatch k: its tokens (first stage) and its loss term (last stage), from
  // rows(k), the microbatch's batch; `parts` is how many loss terms make the mean.
  using RowsFn = std::function<data::Batch(int64_t)>;
  auto pp_tokens = [](RowsFn rows) { return [rows](int64_t k) { return rows(k).tokens; }; };
  auto pp_loss = [&pm](RowsFn rows, int64_t parts) {
    return [&pm, rows, parts](int64_t k, const at::Tensor& logits) {
      return cross_entropy(pm, logits, rows(k).targets) / static_cast<double>(parts);
    };
  };
  // Mean loss over the fixed validation batches: every dp rank its rows, no gradients.
  auto evaluate = [&] {
    at::NoGradGuard no_grad;
    double sum = 0;
    for (int64_t i = 0; i < t.eval_batches; ++i)
      for (int64_t mb = 0; mb < t.micro_batches; ++mb) {
        const int64_t first = pm.dp_rank * local_rows + mb * micro_rows;
        if (pipeline) {
          const auto rows = [&](int64_t k) {
            return data.val_rows(i, first + k * pp_rows, pp_rows);
          };
          sum += pipeline->evaluate(pp_tokens(rows), pp_loss(rows, pp_microbatches));
          continue;
        }
        const data::Batch b = data.val_rows(i, first, micro_rows);
        sum += cross_entropy(pm, model(b.tokens), b.targets).item<double>();
      }
    at::Tensor v =
        at::tensor({sum * loss_weight / static_cast<double>(t.eval_batches * t.micro_batches)},
                   at::TensorOptions().dtype(at::kDouble));
    world_group->all_reduce(v, comm::ReduceOp::kAvg, {"val_loss"});
    return v.item<double>();
  };
  std::optional<CommReport> comm_report;
  if (o.comm_report) comm_report.emplace(c, pm);
  if (!o.profile_path.empty()) profile::set_enabled(true);
  for (int64_t step = resumed + 1; step <= t.steps; ++step) {
    if (comm_report) comm_report->begin_step();
    std::optional<profile::Span> step_span(std::in_place, "step",
                                           [step] { return "step " + std::to_string(step); });
    const auto start = std::chrono::steady_clock::now();
    const double cpu_start = process_cpu_seconds();
    const double lr = t.warmup_steps > 0 && step <= t.warmup_steps
                          ? t.lr * static_cast<double>(step) / static_cast<double>(t.warmup_steps)
                          : t.lr;
    opt->set_lr(lr);
    double loss_sum = 0;
    for (int64_t mb = 0; mb < t.micro_batches; ++mb) {
      const bool last = mb + 1 == t.micro_batches;
      for (auto& h : pm.fsdp) h.set_requires_gradient_sync(last);
      const int64_t first = pm.dp_rank * local_rows + mb * micro_rows;
      if (pipeline) {
        const auto rows = [&](int64_t k) {
          return data.train_rows(step, first + k * pp_rows, pp_rows);
        };
        profile::Span schedule("train", "pipeline schedule");
        loss_sum +=
            pipeline->train_step(pp_tokens(rows), pp_loss(rows, t.micro_batches * pp_microbatches));
        continue;
      }
      const data::Batch b = data.train_rows(step, first, micro_rows);
      std::optional<profile::Span> phase(std::in_place, "train", "forward");
      const at::Tensor logits = model(b.tokens);
      if (dump && step == resumed + 1) {
        const at::Tensor whole = whole_logits(pm, logits);  // collective over tp
        if (pm.tp_mesh->ranks().front() == world.rank())
          dump_rows(o.dump_first_batch, first, b, whole);
      }
      at::Tensor loss = cross_entropy(pm, logits, b.targets) / static_cast<double>(t.micro_batches);
      phase.emplace("train", "backward");
      loss.backward();
      phase.reset();
      loss_sum += loss.item<double>();
    }
    // Loss of the global batch: the mean over data-parallel ranks (tp ranks agree).
    // [loss, preemption request]: a signal seen by any rank stops every rank after this step.
    at::Tensor l = at::tensor({loss_sum * loss_weight, preemption_signal() ? 1.0 : 0.0},
                              at::TensorOptions().dtype(at::kDouble));
    std::optional<comm::TrafficScope> traffic(std::in_place, "train");
    world_group->all_reduce(l, comm::ReduceOp::kAvg, {"loss"});
    const bool preempted = l[1].item<double>() > 0;
    l = l.narrow(0, 0, 1);
    std::optional<profile::Span> phase(std::in_place, "train", "clip_grad_norm");
    const double grad_norm = optim::clip_grad_norm(params, t.grad_clip, world, pp);
    phase.reset();
    traffic.reset();
    // Every rank sees the same (all-reduced) values, so every rank stops here, before the
    // update would write non-finite values into the weights.
    if (!std::isfinite(l.item<double>()) || !std::isfinite(grad_norm)) {
      if (print && world.rank() == 0) progress.finish();
      throw Error(detail::concat(
          "training diverged at step ", step, ": loss ", l.item<double>(), ", grad_norm ",
          grad_norm, " (not finite); the weights are left as they were after step ", step - 1,
          ". Lower train.lr (", t.lr, "), raise train.warmup_steps or set train.grad_clip"));
    }
    phase.emplace("train", "optimizer");
    opt->step();
    opt->zero_grad();
    phase.reset();
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    // CPU seconds of this step summed over every rank (one 8-byte all-reduce).
    at::Tensor cpu =
        at::full({1}, process_cpu_seconds() - cpu_start, at::TensorOptions().dtype(at::kDouble));
    {
      comm::TrafficScope traffic_cpu("train");
      world_group->all_reduce(cpu, comm::ReduceOp::kSum, {"cpu_s"});
    }
    StepMetrics m{step,
                  l.item<double>(),
                  grad_norm,
                  lr,
                  static_cast<double>(t.global_batch_size * t.seq_len) / secs,
                  secs,
                  peak_rss_mb(),
                  cpu.item<double>()};
    if (comm_report) m.comm_bytes = comm_report->end_step();
    step_span.reset();
    if (t.eval_interval > 0 && step % t.eval_interval == 0) m.val_loss = evaluate();
    result.steps.push_back(m);
    // Start-up (rendezvous, materialisation, the first step) is over: from now on every
    // collective must complete within comm.train_timeout_s.
    if (step == 1) comm::set_collective_timeout(c.comm.train_timeout_s, "comm.train_timeout_s");
    if (world.rank() == 0) {
      if (print) progress.step(m);
      if (metrics.is_open()) {
        char buf[512], val[64] = "", comm[48] = "";
        if (std::isfinite(m.val_loss))
          std::snprintf(val, sizeof(val), ", \"val_loss\": %.17g", m.val_loss);
        if (m.comm_bytes >= 0)
          std::snprintf(comm, sizeof(comm), ", \"comm_bytes\": %.17g", m.comm_bytes);
        std::snprintf(buf, sizeof(buf),
                      "{\"step\": %lld, \"loss\": %.17g, \"grad_norm\": %.17g, \"lr\": %.9g, "
                      "\"tokens_per_s\": %.6g, \"step_time_s\": %.6g, \"peak_rss_mb\": %.6g, "
                      "\"cpu_s\": %.6g%s%s}\n",
                      static_cast<long long>(step), m.loss, m.grad_norm, m.lr, m.tokens_per_s,
                      m.step_time_s, m.peak_rss_mb, m.cpu_s, val, comm);
        metrics << buf;
        metrics.flush();
        HP_CHECK(metrics.good(), "--metrics ", metrics_path, ": writing step ", step,
                 " failed (disk full or file removed?)");
      }
    }
    const std::string saved = ckpt.after_step(step, preempted);
    if (!saved.empty()) result.checkpoints.push_back(saved);
    if (preempted) {
      ckpt.finish();
      if (print && world.rank() == 0) progress.finish();
      const int sig = preemption_signal() ? preemption_signal() : SIGTERM;
      throw Preempted(
          sig, detail::concat("preempted (", strsignal(sig), ") after step ", step,
                              saved.empty() ? std::string("; no checkpoint.dir, nothing saved")
                                            : "; checkpoint saved at " + saved));
    }
  }
  ckpt.finish();
  if (print && world.rank() == 0) progress.finish();
  if (!o.profile_path.empty()) {
    profile::set_enabled(false);
    const std::string summary = write_profile_trace(o.profile_path, *world_group);
    if (print && world.rank() == 0)
      std::printf("profile: %s (Chrome trace; open in https://ui.perfetto.dev)\n%s",
                  o.profile_path.c_str(), summary.c_str());
    std::fflush(stdout);
  }
  if (comm_report) {
    const std::string& report = result.comm_report = comm_report->finish(*world_group, print);
    if (metrics.is_open()) {
      metrics << "{\"comm_report\": " << report << "}\n";
      metrics.flush();
      HP_CHECK(metrics.good(), "--metrics ", metrics_path, ": writing the comm report failed");
    }
  }
  return result;
}

}  // namespace hyperpar::train
