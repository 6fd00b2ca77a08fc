#pragma once
// Runs one pipeline rank's lowered schedule (lowering.h) for a training step, or the
// forward-only pass of an evaluation.
//
// Actions: UNSHARD / RESHARD / REDUCE_GRAD call the stage's FSDP groups' explicit
// unshard(), reshard() and reduce_grad() (parallel/fsdp.h): one all-gather and one
// reduce-scatter per group and step, whatever the number of microbatches. F runs the stage
// (its input: the microbatch's tokens on the first stage, else the received activation as
// a leaf that requires grad); on the last stage it also computes the microbatch's loss.
// B back-propagates the loss or the received output gradient; I computes only the input
// gradient (autograd::grad, retaining the graph; checkpointed blocks accumulate no parameter
// gradient then), W then the parameter gradients by a second backward over the retained
// graph. A fused split as PyTorch's (saving the intermediate gradients of I for W) would
// spare W's repeated input-gradient work; here zero-bubble schedules pay ~1 extra backward
// per microbatch for their smaller bubble.
// SEND_F / SEND_B post an asynchronous send of the output / input gradient; RECV_F /
// RECV_B receive into a buffer of the activation shape, which every stage boundary shares
// and the caller derives from the config (no metadata travels). All sends are waited on at
// the end of the step, then the gradient reductions.
//
// Messages are tagged (microbatch, sending stage, direction), so a receive can only ever
// match the message it expects.
//
//   PipelineRuntime rt(spec, pp_group, stages, run_stage, {{mb_rows, seq, dim}, c10::kFloat});
//   double loss_sum = rt.train_step(tokens_of, loss_of);  // last stage: sum of the losses
#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <vector>

#include "hyperpar/comm/communicator.h"
#include "hyperpar/parallel/fsdp.h"
#include "hyperpar/parallel/pipeline/lowering.h"
#include "hyperpar/parallel/pipeline/stage_split.h"

namespace hyperpar::parallel::pipeline {

/// One stage this rank runs.
struct LocalStage {
  int64_t index = 0;  // global stage index
  StageLayers layers;
  std::vector<FSDPHandle> fsdp;  // the stage's parameter groups
};

struct ActivationSpec {
  std::vector<int64_t> shape;  // of the tensor crossing a stage boundary, per microbatch
  c10::ScalarType dtype = c10::kFloat;
};

class PipelineRuntime {
 public:
  /// stage, input -> output (hidden state, or logits on the last stage)
  using StageFn = std::function<at::Tensor(const LocalStage&, const at::Tensor&)>;
  using TokensFn = std::function<at::Tensor(int64_t microbatch)>;
  /// microbatch, logits -> the scalar loss term to back-propagate
  using LossFn = std::function<at::Tensor(int64_t microbatch, const at::Tensor& logits)>;

  /// pp_group: the ranks of this rank's pipeline, group rank = pipeline rank.
  PipelineRuntime(ScheduleSpec spec, std::shared_ptr<comm::Communicator> pp_group,
                  std::vector<LocalStage> stages, StageFn run_stage, ActivationSpec activation);

  /// One step: every action of this rank's schedule. Returns the sum of the loss terms of
  /// the microbatches (on the last stage's ranks; 0 elsewhere).
  double train_step(const TokensFn& tokens, const LossFn& loss);
  /// Forward only (no gradients), microbatch by microbatch through this rank's stages;
  /// returns the sum of the losses on the last stage's ranks, 0 elsewhere.
  double evaluate(const TokensFn& tokens, const LossFn& loss);

  const RankActions& schedule() const { return actions_; }  // every pipeline rank's
  int64_t pp_rank() const { return pp_rank_; }
  bool holds_last_stage() const;
  const std::vector<LocalStage>& stages() const { return stages_; }

 private:
  struct Microbatch {
    at::Tensor input, output, output_grad, input_grad;
  };
  const LocalStage& stage(int64_t index) const;
  int64_t message_tag(int64_t from_stage, int64_t microbatch, bool backward) const;
  at::Tensor receive(int64_t from_stage, int64_t microbatch, bool backward);
  void send(const at::Tensor& t, int64_t to_stage, int64_t from_stage, int64_t microbatch,
            bool backward);
  at::Tensor forward_input(int64_t s, int64_t mb, const TokensFn& tokens);

  ScheduleSpec spec_;
  std::shared_ptr<comm::Communicator> pp_group_;
  int64_t pp_rank_;
  std::vector<LocalStage> stages_;
  StageFn run_stage_;
  ActivationSpec activation_;
  RankActions actions_;
  std::vector<comm::WorkHandle> sends_;
};

}  // namespace hyperpar::parallel::pipeline
