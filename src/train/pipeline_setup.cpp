#include "hyperpar/train/pipeline_setup.h"

#include <ATen/ATen.h>

namespace hyperpar::train {

std::unique_ptr<parallel::pipeline::PipelineRuntime> make_pipeline(const Config& c,
                                                                   ParallelModel& pm) {
  namespace pl = parallel::pipeline;
  const auto& p = c.parallel;
  const auto& t = c.train;
  const pl::ScheduleSpec spec = pipeline_spec(c);
  std::vector<pl::LocalStage> stages;
  for (int64_t s = pm.pp_rank; s < spec.stages(); s += spec.pp)
    stages.push_back({s, pm.stage_layers[s], pm.stage_groups[s]});
  const int64_t rows = t.global_batch_size / (pm.dp_size * t.micro_batches * p.pp_microbatches);
  const int64_t seq = p.sequence_parallel && p.tp > 1 ? t.seq_len / p.tp : t.seq_len;
  std::shared_ptr<models::Transformer> model = pm.model;
  auto run_stage = [model](const pl::LocalStage& st, const at::Tensor& x) {
    return model->forward_stage(st.layers.first, st.layers.end, st.layers.embedding, st.layers.head,
                                x);
  };
  return std::make_unique<pl::PipelineRuntime>(
      spec, pm.pp_mesh->get_group(0), std::move(stages), run_stage,
      pl::ActivationSpec{{rows, seq, c.model.dim}, p.param_dtype});
}

}  // namespace hyperpar::train
