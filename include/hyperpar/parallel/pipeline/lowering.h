#pragma once
// From compute actions to everything a rank does (PyTorch's "schedule with comms"):
// - communication: stage s's forward output goes to stage s + 1 and its input gradient back
//   to stage s - 1 unless both stages are on the same rank. Each SEND follows the compute
//   that produces it (it is asynchronous: it never waits for its receiver); each RECV comes
//   right before the compute that needs it (it waits for the matching SEND):
//     rank 0: 0F0 0SEND_F0 ...     rank 1: 1RECV_F0 1F0 ... 1B0 1SEND_B0
//     rank 0: ... 0RECV_B0 0B0
// - FSDP (with_fsdp): per stage and step, 0UNSHARD before the stage's first action, and
//   after its last backward (B, or W when split) 0REDUCE_GRAD then 0RESHARD: parameters are
//   gathered once per step and stage, not per microbatch, and gradients reduce-scattered
//   once, after the last microbatch (torchtitan's FSDP-under-PP setting).
#include "hyperpar/parallel/pipeline/schedules.h"

namespace hyperpar::parallel::pipeline {

RankActions add_communication(const RankActions& compute, const ScheduleSpec& s);
RankActions add_fsdp(const RankActions& actions, const ScheduleSpec& s);
/// compute_schedule + add_communication (+ add_fsdp).
RankActions lowered_schedule(const ScheduleSpec& s, bool with_fsdp);

}  // namespace hyperpar::parallel::pipeline
