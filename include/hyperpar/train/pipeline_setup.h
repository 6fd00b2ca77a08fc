#pragma once
// The pipeline runtime of a ParallelModel built with parallel.pp > 1: this rank's stages
// (their layers and FSDP groups), its pipeline group, the lowered schedule of the config,
// and the activation that crosses every stage boundary, derived from the config:
//   [global_batch / (dp x micro_batches x pp_microbatches), seq_len (/ tp with sequence
//    parallel), dim] in param_dtype.
#include <memory>

#include "hyperpar/parallel/pipeline/pipeline_runtime.h"
#include "hyperpar/train/parallel_model.h"

namespace hyperpar::train {

std::unique_ptr<parallel::pipeline::PipelineRuntime> make_pipeline(const Config& c,
                                                                   ParallelModel& pm);

}  // namespace hyperpar::train
