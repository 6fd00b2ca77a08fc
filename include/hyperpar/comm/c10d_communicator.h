#pragma once
// C10dCommunicator: collectives on a LibTorch c10d ProcessGroup backend (gloo on CPU).
//
// One backend object per distinct rank set, rendezvousing through a TCPStore under a
// per-rank-set PrefixStore, so only the members take part in creating it.
//
// Mapping to c10d (all tensors already checked contiguous by Communicator):
//   all_gather_into_tensor -> _allgather_base      reduce_scatter_tensor -> _reduce_scatter_base
//   all_reduce             -> allreduce            all_to_all_single     -> alltoall_base
//   broadcast              -> broadcast            barrier               -> barrier
// gloo has no average: avg runs as a sum and one division at completion (as on MPI), so
// fp32 averages round once. Data movement (gather, all-to-all, broadcast) sends raw bytes,
// so every dtype moves; reductions take float32/64, float16, bfloat16 and integer dtypes.
//
// The process-wide store comes from the launcher's environment (MASTER_ADDR, MASTER_PORT,
// RANK, WORLD_SIZE): rank 0 serves it, or, under torchrun (TORCHELASTIC_USE_AGENT_STORE=True),
// every rank connects to the agent's store.
#include <memory>

#include "hyperpar/comm/communicator.h"

namespace hyperpar::comm {

/// Creates the gloo communicator of `ranks` (ordered global ranks, caller included).
/// Collective over the members only.
std::shared_ptr<Communicator> make_gloo_communicator(const std::vector<int64_t>& ranks,
                                                     int64_t global_rank, const std::string& label);

/// Connects to (rank 0: serves) the process-wide rendezvous store, waiting at most the
/// current collective timeout (comm.init_timeout_s at start-up) and naming the master's
/// address and port when it gives up. Called before the first gloo group is created.
void connect_gloo_store();

/// Whether this build has the c10d gloo backend (false when built without gloo headers).
bool gloo_available();

}  // namespace hyperpar::comm
