// hyperpar-schedule: prints and checks a pipeline schedule (parallel/pipeline/), in PyTorch's
// action notation, without running anything.
//
//   hyperpar-schedule --schedule Interleaved1F1B --pp 4 --virtual_stages 2 --microbatches 8
//   hyperpar-schedule --schedule 1F1B --pp 4 --microbatches 8 --compute_only   # F/B only
//   hyperpar-schedule --schedule InterleavedZeroBubble --pp 8 --microbatches 16 --fsdp
//
// Each rank's actions, then "valid; bubble fraction ..." (simulator.h). Exit 0 when valid,
// 1 when the simulator finds a problem, 2 for impossible sizes.
#include <CLI/CLI.hpp>
#include <iostream>

#include "hyperpar/core/error.h"
#include "hyperpar/parallel/pipeline/simulator.h"

using namespace hyperpar;
using namespace hyperpar::parallel::pipeline;

int main(int argc, char** argv) {
  CLI::App app{"hyperpar-schedule: print and check a pipeline schedule"};
  std::string name = "1F1B";
  ScheduleSpec s;
  int64_t layers = -1;
  bool fsdp = false, compute_only = false;
  app.add_option("--schedule", name, "GPipe | 1F1B | Interleaved1F1B | InterleavedZeroBubble");
  app.add_option("--pp", s.pp, "pipeline ranks")->required();
  app.add_option("--virtual_stages", s.virtual_stages, "stages per rank (1)");
  app.add_option("--microbatches", s.microbatches, "microbatches per step")->required();
  app.add_option("--n_layers", layers, "check that the layers fill the stages");
  app.add_flag("--fsdp", fsdp, "add FSDP's UNSHARD / REDUCE_GRAD / RESHARD actions");
  app.add_flag("--compute_only", compute_only, "only F, B, I, W (PyTorch's pipeline_order)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  try {
    s.kind = parse_schedule(name, "--schedule");
    check_schedule(s, layers);
    if (compute_only) {
      const auto c = compute_schedule(s);
      for (size_t r = 0; r < c.size(); ++r)
        std::cout << "rank " << r << ": " << to_string(c[r]) << "\n";
      return 0;
    }
    const auto actions = lowered_schedule(s, fsdp);
    std::cout << describe_schedule(actions, s);
    return simulate(actions, s).ok() ? 0 : 1;
  } catch (const UsageError& e) {
    std::cerr << "hyperpar-schedule: " << e.what() << "\n";
    return 2;
  }
}
