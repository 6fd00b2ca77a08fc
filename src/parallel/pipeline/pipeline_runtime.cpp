#include "hyperpar/parallel/pipeline/pipeline_runtime.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/autograd.h>

#include <map>

#include "hyperpar/comm/traffic.h"
#include "hyperpar/core/error.h"
#include "hyperpar/core/profiler.h"
#include "hyperpar/nn/checkpoint.h"

namespace hyperpar::parallel::pipeline {

PipelineRuntime::PipelineRuntime(ScheduleSpec spec, std::shared_ptr<comm::Communicator> pp_group,
                                 std::vector<LocalStage> stages, StageFn run_stage,
                                 ActivationSpec activation)
    : spec_(spec),
      pp_group_(std::move(pp_group)),
      pp_rank_(pp_group_->rank()),
      stages_(std::move(stages)),
      run_stage_(std::move(run_stage)),
      activation_(std::move(activation)) {
  HP_CHECK(pp_group_->size() == spec_.pp, "pipeline: the pp group has ", pp_group_->size(),
           " ranks, the schedule ", spec_.pp);
  for (const auto& st : stages_)
    HP_CHECK(rank_of_stage(st.index, spec_.pp) == pp_rank_, "pipeline: stage ", st.index,
             " does not belong to pipeline rank ", pp_rank_);
  actions_ = lowered_schedule(spec_, /*with_fsdp=*/true);
}

bool PipelineRuntime::holds_last_stage() const {
  for (const auto& st : stages_)
    if (st.layers.head) return true;
  return false;
}

const LocalStage& PipelineRuntime::stage(int64_t index) const {
  for (const auto& st : stages_)
    if (st.index == index) return st;
  throw Error(detail::concat("pipeline: stage ", index, " is not on pipeline rank ", pp_rank_));
}

int64_t PipelineRuntime::message_tag(int64_t from_stage, int64_t mb, bool backward) const {
  return (mb * spec_.stages() + from_stage) * 2 + (backward ? 1 : 0);
}

at::Tensor PipelineRuntime::receive(int64_t from_stage, int64_t mb, bool backward) {
  at::Tensor buf = at::empty(activation_.shape, at::TensorOptions().dtype(activation_.dtype));
  const std::string what = backward ? "pp.grad" : "pp.activation";
  comm::TrafficScope traffic("pp");
  pp_group_->recv(buf, rank_of_stage(from_stage, spec_.pp),
                  {detail::concat(what, " of stage ", from_stage, " microbatch ", mb), false,
                   message_tag(from_stage, mb, backward)});
  return buf;
}

void PipelineRuntime::send(const at::Tensor& t, int64_t to_stage, int64_t from_stage, int64_t mb,
                           bool backward) {
  const std::string what = backward ? "pp.grad" : "pp.activation";
  HP_CHECK(t.defined(), "pipeline: stage ", from_stage, " has no ", what, " of microbatch ", mb,
           " to send");
  comm::TrafficScope traffic("pp");
  sends_.push_back(
      pp_group_->send(t.detach().contiguous(), rank_of_stage(to_stage, spec_.pp),
                      {detail::concat(what, " of stage ", from_stage, " microbatch ", mb), true,
                       message_tag(from_stage, mb, backward)}));
}

double PipelineRuntime::train_step(const TokensFn& tokens, const LossFn& loss) {
  std::map<std::pair<int64_t, int64_t>, Microbatch> mbs;  // (stage, microbatch)
  double loss_sum = 0;
  for (const Action& a : actions_[pp_rank_]) {
    const int64_t s = a.stage, mb = a.microbatch;
    const LocalStage& st = stage(s);
    Microbatch& m = mbs[{s, std::max<int64_t>(mb, 0)}];
    profile::Span span("pipeline", [&] { return to_string(a); });  // e.g. "1F3"
    switch (a.type) {
      case ActionType::kUnshard:
        for (auto h : st.fsdp) h.unshard();
        break;
      case ActionType::kReshard:
        for (auto h : st.fsdp) h.reshard();
        break;
      case ActionType::kReduceGrad:
        for (auto h : st.fsdp) h.reduce_grad();
        break;
      case ActionType::kRecvF:
        m.input = receive(s - 1, mb, false).requires_grad_(true);
        break;
      case ActionType::kRecvB:
        m.output_grad = receive(s + 1, mb, true);
        break;
      case ActionType::kSendF:
        send(m.output, s + 1, s, mb, false);
        break;
      case ActionType::kSendB:
        send(m.input_grad, s - 1, s, mb, true);
        m.input_grad = at::Tensor();
        break;
      case ActionType::kForward: {
        if (st.layers.embedding) {
          m.input = tokens(mb);
        } else if (!m.input.defined()) {
          // The previous stage ran on this rank: its output, as a leaf of this stage's graph.
          m.input = mbs[{s - 1, mb}].output.detach().requires_grad_(true);
        }
        at::Tensor out = run_stage_(st, m.input);
        if (st.layers.head) {
          out = loss(mb, out);
          loss_sum += out.item<double>();
        }
        m.output = out;
        break;
      }
      case ActionType::kBackward:
      case ActionType::kBackwardInput:
      case ActionType::kBackwardWeight: {
        if (!st.layers.head && !m.output_grad.defined())
          m.output_grad = mbs[{s + 1, mb}].input_grad;  // the next stage ran on this rank
        HP_CHECK(st.layers.head || m.output_grad.defined(), "pipeline: ", to_string(a),
                 " has no output gradient");
        std::vector<at::Tensor> grads;
        if (!st.layers.head) grads.push_back(m.output_grad);
        const bool needs_input = m.input.defined() && m.input.requires_grad();
        if (a.type == ActionType::kBackward) {
          torch::autograd::backward({m.output}, grads);
          if (needs_input) m.input_grad = m.input.grad();
        } else if (a.type == ActionType::kBackwardInput) {
          if (needs_input) {
            nn::InputGradsOnly only_inputs;  // checkpointed blocks: no parameter gradients yet
            m.input_grad = torch::autograd::grad({m.output}, {m.input}, grads,
                                                 /*retain_graph=*/true)[0];
          }
          break;  // the graph stays for W
        } else {
          // The whole backward again: parameters used inside checkpointed blocks are not
          // edges of the outer graph, so restricting it to the parameters would skip them.
          torch::autograd::backward({m.output}, grads);
        }
        // This microbatch is done on this stage: free its activations.
        const at::Tensor input_grad = m.input_grad;
        m = Microbatch{};
        m.input_grad = input_grad;
        break;
      }
    }
  }
  for (auto& w : sends_) w->wait();
  sends_.clear();
  wait_gradient_reductions();
  return loss_sum;
}

double PipelineRuntime::evaluate(const TokensFn& tokens, const LossFn& loss) {
  at::NoGradGuard no_grad;
  for (const auto& st : stages_)
    for (auto h : st.fsdp) h.unshard();
  double loss_sum = 0;
  for (int64_t mb = 0; mb < spec_.microbatches; ++mb) {
    at::Tensor carried;  // output of the previous stage when it ran on this rank
    for (const auto& st : stages_) {
      const int64_t s = st.index;
      at::Tensor in;
      if (st.layers.embedding)
        in = tokens(mb);
      else if (rank_of_stage(s - 1, spec_.pp) == pp_rank_)
        in = carried;
      else
        in = receive(s - 1, mb, false);
      at::Tensor out = run_stage_(st, in);
      if (st.layers.head) {
        loss_sum += loss(mb, out).item<double>();
      } else if (rank_of_stage(s + 1, spec_.pp) != pp_rank_) {
        send(out, s + 1, s, mb, false);
      }
      carried = out;
    }
  }
  for (auto& w : sends_) w->wait();
  sends_.clear();
  for (const auto& st : stages_)
    for (auto h : st.fsdp) h.reshard();
  return loss_sum;
}

}  // namespace hyperpar::parallel::pipeline
