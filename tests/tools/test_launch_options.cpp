// hyperpar-run's flag parsing: msrun's form without "--", boolean values, torchrun aliases
// and the messages of every flag error.
#include <gtest/gtest.h>

#include "hyperpar/comm/backend_choice.h"
#include "launcher/launch_options.h"

using hyperpar::launcher::LaunchOptions;
using hyperpar::launcher::LaunchUsageError;
using hyperpar::launcher::parse_launch_args;

namespace {

std::string error_of(const std::vector<std::string>& args) {
  try {
    parse_launch_args(args);
  } catch (const LaunchUsageError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(LaunchOptions, MsrunFormWithoutDoubleDash) {
  const auto o = parse_launch_args({"--worker_num=8", "--local_worker_num=8", "--master_port=8128",
                                    "--log_dir=logs", "--join=True", "build/tools/hyperpar-train",
                                    "--config", "configs/tp2_fsdp.yaml", "--join=False"});
  EXPECT_EQ(o.worker_num, 8);
  EXPECT_EQ(o.local_worker_num, 8);
  EXPECT_EQ(o.master_port, 8128);
  EXPECT_EQ(o.log_dir, "logs");
  EXPECT_TRUE(o.join);
  // Everything from the program on is the program's, untouched (its own --join too).
  EXPECT_EQ(o.command, (std::vector<std::string>{"build/tools/hyperpar-train", "--config",
                                                 "configs/tp2_fsdp.yaml", "--join=False"}));
}

TEST(LaunchOptions, DoubleDashStillAccepted) {
  const auto o = parse_launch_args({"--worker_num", "2", "--", "--weird-program-name", "x"});
  EXPECT_EQ(o.command, (std::vector<std::string>{"--weird-program-name", "x"}));
}

TEST(LaunchOptions, JoinForms) {
  EXPECT_TRUE(parse_launch_args({"--join", "prog"}).join);
  EXPECT_EQ(parse_launch_args({"--join", "prog"}).command[0], "prog");
  for (const char* v : {"False", "false", "0"}) {
    EXPECT_FALSE(parse_launch_args({"--join", v, "prog"}).join) << v;
    EXPECT_FALSE(parse_launch_args({std::string("--join=") + v, "prog"}).join) << v;
  }
  for (const char* v : {"True", "true", "1"}) {
    const auto o = parse_launch_args({"--join", v, "prog"});
    EXPECT_TRUE(o.join) << v;
    EXPECT_EQ(o.command, (std::vector<std::string>{"prog"})) << "a boolean is never the program";
  }
  EXPECT_FALSE(parse_launch_args({"--no-join", "prog"}).join);
  EXPECT_NE(error_of({"--join=maybe", "prog"})
                .find("--join takes True|true|1|False|false|0, got 'maybe'"),
            std::string::npos);
}

TEST(LaunchOptions, TorchrunAliases) {
  auto o = parse_launch_args({"--nproc_per_node", "4", "--nnodes", "2", "--node_rank", "1",
                              "--master_addr", "10.0.0.1", "--master-port", "1234", "prog"});
  EXPECT_EQ(o.worker_num, 8);
  EXPECT_EQ(o.local_worker_num, 4);
  EXPECT_EQ(o.node_rank, 1);
  EXPECT_EQ(o.master_addr, "10.0.0.1");
  EXPECT_EQ(o.master_port, 1234);
  o = parse_launch_args({"--nproc-per-node=3", "prog"});
  EXPECT_EQ(o.worker_num, 3);
  EXPECT_EQ(o.local_worker_num, 3);
  o = parse_launch_args({"--standalone", "--nproc_per_node", "2", "prog"});
  EXPECT_EQ(o.worker_num, 2);
  EXPECT_EQ(o.master_port, 0) << "standalone picks a free port";
  o = parse_launch_args({"--worker_num", "8", "--nnodes", "2", "prog"});
  EXPECT_EQ(o.local_worker_num, 4);
  // Both families agreeing is fine; disagreeing names both.
  EXPECT_EQ(parse_launch_args({"--worker_num", "8", "--nproc_per_node", "8", "prog"}).worker_num,
            8);
  EXPECT_EQ(error_of({"--worker_num", "8", "--nnodes", "1", "--nproc_per_node", "4", "prog"}),
            "--worker_num 8 disagrees with --nnodes 1 x workers per node 4 = 4");
  EXPECT_EQ(error_of({"--local_worker_num", "2", "--nproc_per_node", "4", "prog"}),
            "--local_worker_num 2 disagrees with --nproc_per_node 4");
  EXPECT_NE(error_of({"--nnodes", "1:4", "--nproc_per_node", "2", "prog"}).find("elastic range"),
            std::string::npos);
}

TEST(LaunchOptions, FlagErrorsNameFlagValueAndExpectation) {
  EXPECT_EQ(error_of({"--worker_num", "0", "prog"}),
            "--worker_num must be a positive integer, got 0");
  EXPECT_EQ(error_of({"--worker_num=abc", "prog"}),
            "--worker_num must be a positive integer, got 'abc'");
  EXPECT_EQ(error_of({"--master_port", "70000", "prog"}),
            "--master_port must be 1..65535, got 70000");
  EXPECT_EQ(error_of({"--master_port", "0", "prog"}), "--master_port must be 1..65535, got 0");
  EXPECT_EQ(error_of({"--backend", "nccl", "prog"}), "--backend must be mpi or gloo, got 'nccl'");
  EXPECT_EQ(error_of({"--worker_num", "8", "--local_worker_num", "3", "prog"}),
            "--local_worker_num 3 must divide --worker_num 8");
  EXPECT_EQ(error_of({"--worker_num", "8", "--local_worker_num", "4", "--node_rank", "2", "prog"}),
            "--node_rank must be below the node count 2, got 2");
  EXPECT_EQ(error_of({"--node_rank", "-1", "prog"}),
            "--node_rank must be a node index >= 0, got -1");
  EXPECT_EQ(error_of({"--log_dir"}), "--log_dir needs a value");
  EXPECT_EQ(error_of({"--worker_num", "2"}),
            "no program given: hyperpar-run [flags] PROGRAM [ARGS...]");
  EXPECT_NE(error_of({"--colour", "red", "prog"}).find("unknown flag --colour"), std::string::npos);
  EXPECT_NE(error_of({"--standalone", "--nnodes", "2", "--nproc_per_node", "2", "prog"})
                .find("--standalone is a single-node job"),
            std::string::npos);
}

TEST(BackendChoice, OnePlaceDecides) {
  using hyperpar::comm::BackendRequest;
  using hyperpar::comm::choose_backend;
  BackendRequest r;
  EXPECT_EQ(choose_backend(r), "mpi");
  r.config = "gloo";
  r.config_source = "configs/a.yaml";
  EXPECT_EQ(choose_backend(r), "gloo") << "the config is honoured when the launcher is silent";
  r.flag = "gloo";
  EXPECT_EQ(choose_backend(r), "gloo");
  r.flag = "mpi";
  try {
    choose_backend(r);
    FAIL() << "conflict not reported";
  } catch (const hyperpar::comm::BackendConflict& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "--backend mpi conflicts with comm.backend: gloo in configs/a.yaml"),
              std::string::npos)
        << e.what();
  }
  BackendRequest t;
  t.started_by = "gloo";
  t.started_by_name = "torchrun";
  t.config = "mpi";
  EXPECT_THROW(choose_backend(t), hyperpar::comm::BackendConflict);
}
