#pragma once
// Trainer configuration: YAML with sections model / parallel / train / comm (see configs/).
//
//   model:    {vocab_size, dim, n_layers, n_heads, n_kv_heads, ffn_hidden, norm_eps (1e-5),
//              rope_theta (10000), moe: {n_experts, top_k, layers: [..], shared_expert},
//              init_from (hf:DIR: config and weights of a Hugging Face Llama/Mixtral
//              directory, checkpoint/hf_import.h; any other model key must agree with it)}
//   parallel: {tp, ep, dp_replicate, dp_shard (-1 = infer), init_on_meta,
//              reshard_after_forward (true | always | false | k ranks; true and k keep
//              the root and the last block unsharded after forward, as FSDP2 and
//              torchtitan do, since backward needs them at once; always reshards those
//              too), prefetch,
//              param_dtype (float32|bfloat16), reduce_dtype, sequence_parallel,
//              loss_parallel (true: with tp > 1 the logits stay split over the
//              vocabulary and the loss is parallel/loss_parallel.h's, torchtitan's default;
//              false: they are gathered),
//              expert_tp (1 | tp, see parallel/expert_mesh.h), expert_shard_dim (auto |
//              0 | 1: the dim expert FSDP shards expert weights on; auto, as for every other
//              parameter: dim 0 if it divides over the shard ranks, else the least padded
//              dim (parallel::least_padded_dim): dim 1 for 2 local experts over 4 ranks),
//              pp (pipeline stages' ranks, outermost mesh dim), pp_schedule (GPipe | 1F1B |
//              Interleaved1F1B | InterleavedZeroBubble), pp_microbatches, pp_virtual_stages
//              (stages per pp rank), fsdp_collectives (per_param | per_group:
//              parallel/fsdp.h FSDPCollectives), fsdp_host_shared (true: one unsharded
//              copy per host, FSDPOptions::host_shared_params), pp_split ([first layer of each
//              stage]; default even), activation_checkpoint (none | full | every:K | selective)}
//   train:    {steps, global_batch_size, micro_batches, seq_len, lr, warmup_steps,
//              weight_decay, grad_clip, seed, optimizer (adamw|sgd),
//              eval_interval (0: no evaluation), eval_batches (2)}
//   data:     {synthetic (true), path, format (auto|u16|u32|llmc), val_path, val_fraction,
//              shuffle_seed}  (data/data_loader.h; a path turns synthetic off)
//   comm:     {backend (mpi|gloo; default: the launcher's, else mpi),
//              init_timeout_s (300), train_timeout_s (100)}  (comm/watchdog.h)
//   checkpoint: {dir, interval, keep, async, resume (auto|never|PATH), strict}
//              (checkpoint/checkpoint.h; train/checkpointing.h)
// train.grad_clip 0 means no clipping. model.moe.n_experts 0 makes the model dense.
// The file must be a non-empty mapping without repeated keys.
// --set section.key=value overrides one scalar (YAML syntax for the value). Unknown keys and
// invalid combinations throw ConfigError, which the trainer reports with exit code 2 on every
// rank before any communication.
#include <string>
#include <vector>

#include "hyperpar/core/error.h"
#include "hyperpar/data/data_loader.h"
#include "hyperpar/models/transformer.h"
#include "hyperpar/parallel/activation_checkpoint.h"
#include "hyperpar/parallel/fsdp.h"
#include "hyperpar/parallel/pipeline/schedules.h"

namespace hyperpar::train {

class ConfigError : public UsageError {
 public:
  using UsageError::UsageError;
};

struct ParallelConfig {
  int64_t tp = 1, ep = 1, dp_replicate = 1, dp_shard = -1;
  int64_t expert_tp = 1;          // 1: ep borrows from dp_shard*tp; tp: experts split over tp too
  int64_t expert_shard_dim = -1;  // -1 (auto): parallel::expert_fsdp_shard_dim; 0; 1
  bool init_on_meta = true, reshard_after_forward = true, sequence_parallel = false;
  bool loss_parallel = true;           // tp > 1: logits split over the vocabulary into the loss
  int64_t reshard_to = 0;              // reshard_after_forward: k -> post-forward groups of k ranks
  bool reshard_root_and_last = false;  // reshard_after_forward: always
  bool prefetch = true;  // FSDP all-gather prefetch of the next group (forward, backward)
  // FSDP collectives per group or per parameter (parallel/fsdp.h FSDPCollectives)
  parallel::FSDPCollectives fsdp_collectives = parallel::FSDPCollectives::kPerParam;
  bool fsdp_host_shared = true;  // parallel/fsdp.h FSDPOptions::host_shared_params
  c10::ScalarType param_dtype = c10::kFloat, reduce_dtype = c10::kFloat;
  // Pipeline parallelism (parallel/pipeline/): world = pp x dp_replicate x dp_shard x tp.
  int64_t pp = 1, pp_microbatches = 1, pp_virtual_stages = 1;
  std::string pp_schedule = "1F1B";
  std::vector<int64_t> pp_split;  // first layer of each stage; empty: even split
  parallel::ActivationCheckpoint activation_checkpoint;  // parallel/activation_checkpoint.h
};

struct TrainConfig {
  int64_t steps = 20, global_batch_size = 8, micro_batches = 1, seq_len = 16, warmup_steps = 0;
  double lr = 1e-3, weight_decay = 0.0, grad_clip = 1.0;
  uint64_t seed = 0;
  std::string optimizer = "adamw";
  int64_t eval_interval = 0, eval_batches = 2;
};

struct CommConfig {
  std::string backend;  // mpi | gloo; empty: the launcher's choice, else mpi (backend_choice.h)
  double init_timeout_s = 300;   // rendezvous, materialisation, first step (watchdog.h)
  double train_timeout_s = 100;  // every collective after the first step
};

struct CheckpointConfig {
  std::string dir;              // empty: no checkpoints
  int64_t interval = 0;         // save every `interval` steps (0: only on preemption)
  int64_t keep = 0;             // keep the newest K complete checkpoints (0: all)
  bool async = false;           // write in the background; the step only copies the shards
  std::string resume = "auto";  // auto (newest complete in dir) | never | a step-N path
  bool strict = true;           // false: optimizer state missing from the checkpoint is allowed
};

struct Config {
  models::TransformerConfig model;
  std::string init_from;  // model.init_from: "" or hf:DIR
  /// The keys the config file and --set gave, with their values as written (so that
  /// model.init_from can tell which model keys disagree with the imported config).
  std::vector<std::pair<std::string, std::string>> keys_given;
  data::DataConfig data;
  ParallelConfig parallel;
  TrainConfig train;
  CommConfig comm;
  CheckpointConfig checkpoint;
};

/// Parses `path` and applies `overrides` ("section.key=value").
Config load_config(const std::string& path, const std::vector<std::string>& overrides);
/// Checks values and sizes against `world_size` and infers dp_shard; throws ConfigError.
/// c.comm.backend should be resolved first (the MPI backend reduces float32 only).
void validate(Config& c, int64_t world_size);
/// The pipeline schedule of c.parallel (pp, pp_virtual_stages, pp_microbatches, pp_schedule).
parallel::pipeline::ScheduleSpec pipeline_spec(const Config& c);

}  // namespace hyperpar::train
