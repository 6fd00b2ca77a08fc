#pragma once
// Shared by the 8-rank training tests: run a config (distributed on the launcher's world, or
// on a simulated 1-rank world) and compare a run with a baseline step by step.
// Needs HYPERPAR_SOURCE_DIR (the configs/ directory's parent).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "hyperpar/dtensor/dtensor.h"
#include "hyperpar/train/trainer.h"

namespace hyperpar::test {

inline std::string cfg_path(const std::string& name) {
  return std::string(HYPERPAR_SOURCE_DIR) + "/configs/" + name;
}

inline double rel(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-30); }
inline double rel_t(const at::Tensor& a, const at::Tensor& b) {
  const double nb = b.to(at::kDouble).norm().item<double>();
  return (a.to(at::kDouble) - b.to(at::kDouble)).norm().item<double>() / std::max(nb, 1e-30);
}

struct TrainRun {
  std::vector<double> losses, grad_norms, val_losses;
  std::map<std::string, at::Tensor> weights;  // gathered full weights
};

inline TrainRun run(const std::string& config, const std::vector<std::string>& sets,
                    bool distributed, train::ParallelModel* keep = nullptr) {
  auto world = distributed ? comm::World::from_env() : comm::World::simulated(0, 1);
  std::vector<std::string> all_sets{"train.eval_interval=5"};
  all_sets.insert(all_sets.end(), sets.begin(), sets.end());
  train::Config c = train::load_config(cfg_path(config), all_sets);
  train::validate(c, world->size());
  auto pm = train::build_parallel_model(c, world);
  auto res = train::run_training(c, pm, *world, "", false);
  TrainRun r;
  for (const auto& s : res.steps) {
    r.losses.push_back(s.loss);
    r.grad_norms.push_back(s.grad_norm);
    if (std::isfinite(s.val_loss)) r.val_losses.push_back(s.val_loss);
  }
  for (auto& [n, p] : pm.model->named_parameters())
    r.weights[n] = p->spec ? dtensor::DTensor(p->data.detach(), *p->spec).full_tensor()
                           : p->data.detach().clone();
  if (keep) *keep = pm;
  return r;
}

inline const TrainRun& baseline() {
  static TrainRun r = run("single.yaml", {}, false);
  return r;
}

inline void expect_matches(const TrainRun& got, const TrainRun& want, double tol,
                           const std::string& what) {
  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (size_t s = 0; s < got.losses.size(); ++s)
    EXPECT_LE(rel(got.losses[s], want.losses[s]), tol)
        << what << " step " << s + 1 << ": " << got.losses[s] << " vs " << want.losses[s];
  // The clipped global gradient norm (dense and expert parameters on different meshes)
  // equals the single-rank norm.
  for (size_t s = 0; s < got.grad_norms.size(); ++s)
    EXPECT_LE(rel(got.grad_norms[s], want.grad_norms[s]), tol)
        << what << " step " << s + 1 << " grad norm: " << got.grad_norms[s] << " vs "
        << want.grad_norms[s];
  ASSERT_EQ(got.val_losses.size(), want.val_losses.size());
  EXPECT_EQ(got.val_losses.size(), got.losses.size() / 5) << what;
  for (size_t i = 0; i < got.val_losses.size(); ++i)
    EXPECT_LE(rel(got.val_losses[i], want.val_losses[i]), tol)
        << what << " val_loss at step " << 5 * (i + 1) << ": " << got.val_losses[i] << " vs "
        << want.val_losses[i];
  // The weights this rank holds (all of them, or its pipeline stages'), each against the
  // baseline's.
  double worst = 0;
  EXPECT_FALSE(got.weights.empty()) << what;
  for (const auto& [n, w] : got.weights) {
    ASSERT_TRUE(want.weights.count(n)) << what << ": " << n << " is not in the baseline";
    const double d = rel_t(w, want.weights.at(n));
    worst = std::max(worst, d);
    EXPECT_LE(d, tol) << what << " final weight " << n;
  }
  if (comm::World::from_env()->rank() == 0)
    std::cout << what << ": first loss " << got.losses.front() << ", last " << got.losses.back()
              << ", worst final-weight rel diff " << worst << "\n";
}

}  // namespace hyperpar::test
