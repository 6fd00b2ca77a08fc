// The launcher's culprit: the first worker that failed on its own, not a collateral one,
// whatever order the records were written in.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "common/temp_dir.h"
#include "hyperpar/core/worker_record.h"
#include "launcher/failure_report.h"

namespace rec = hyperpar::record;
using hyperpar::launcher::Ending;
using hyperpar::launcher::read_failure_report;

namespace {

using hyperpar::testing::TempDir;

void exit_record(const std::string& dir, int rank, const char* how, int code, int sig, bool stopped,
                 int64_t t, int64_t stop_t = 0) {
  rec::write(rec::path(dir, rank, "exit"), {{"how", how},
                                            {"code", std::to_string(code)},
                                            {"signal", std::to_string(sig)},
                                            {"stopped", stopped ? "1" : "0"},
                                            {"stop_time_ns", std::to_string(stop_t)},
                                            {"time_ns", std::to_string(t)}});
}

void error_record(const std::string& dir, int rank, const char* kind, int64_t t, const char* msg) {
  rec::write(rec::path(dir, rank, "error"),
             {{"kind", kind}, {"time_ns", std::to_string(t)}, {"message", msg}});
}

}  // namespace

TEST(FailureReport, KilledWorkerBeatsEarlierPeerErrors) {
  TempDir d;
  // Worker 2 reported "peer closed" *before* worker 5's shim noticed the SIGKILL.
  exit_record(d.path, 0, "signal", 143, 15, true, 300, 250);
  exit_record(d.path, 1, "exit", 0, 0, false, 100);
  error_record(d.path, 2, "peer", 150, "gloo collective failed: Connection closed by peer");
  exit_record(d.path, 2, "exit", 1, 0, false, 160);
  exit_record(d.path, 5, "signal", 137, 9, false, 200);
  const auto rep = read_failure_report(d.path, 0, 6);
  ASSERT_TRUE(rep.culprit);
  EXPECT_EQ(rep.culprit->rank, 5);
  EXPECT_EQ(rep.culprit->description, "killed by SIGKILL");
  EXPECT_EQ(rep.culprit->code, 137);
  EXPECT_EQ(rep.workers[2].ending, Ending::kConsequence);
  EXPECT_EQ(rep.workers[0].ending, Ending::kStopped);
  EXPECT_EQ(rep.workers[3].ending, Ending::kMissing);
  rec::write(rec::path(d.path, 4, "pid"), {{"shim", "1"}, {"program", "2"}});
  EXPECT_EQ(read_failure_report(d.path, 0, 6).workers[4].ending, Ending::kStopped)
      << "started, then its shim was SIGKILLed by mpirun";
  const std::string text = rep.text(d.path);
  EXPECT_NE(text.find("worker 5 killed by SIGKILL; see " + d.path + "/worker_5.log"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("failed as a consequence: worker 2 (exited with code 1: gloo collective"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("stopped by the launcher: worker 0"), std::string::npos) << text;
}

TEST(FailureReport, SigkillFromOutsideIsTheCulpritEvenWhenReapedAfterTheStop) {
  TempDir d;
  // Under load worker 0 reports the broken connection and the launcher tells everyone to
  // stop (SIGTERM) before worker 1's shim reaps its kill -9'd program: the SIGKILL came from
  // outside, since neither the stop request nor the shim's escalation sent it.
  error_record(d.path, 0, "peer", 100, "gloo collective failed: Connection closed by peer");
  exit_record(d.path, 0, "exit", 1, 0, false, 110);
  auto killed = [&](int rank, const char* escalated) {
    rec::write(rec::path(d.path, rank, "exit"), {{"how", "signal"},
                                                 {"code", "137"},
                                                 {"signal", "9"},
                                                 {"stopped", "1"},
                                                 {"stop_signal", "15"},
                                                 {"stop_time_ns", "120"},
                                                 {"escalated", escalated},
                                                 {"time_ns", "130"}});
  };
  killed(1, "0");
  killed(2, "1");  // ignored SIGTERM for the whole grace period: its shim sent the SIGKILL
  const auto rep = read_failure_report(d.path, 0, 3);
  ASSERT_TRUE(rep.culprit);
  EXPECT_EQ(rep.culprit->rank, 1);
  EXPECT_EQ(rep.culprit->code, 137);
  EXPECT_EQ(rep.workers[0].ending, Ending::kConsequence);
  EXPECT_EQ(rep.workers[2].ending, Ending::kStopped);
  EXPECT_NE(rep.text(d.path).find("worker 1 killed by SIGKILL; see"), std::string::npos);
}

TEST(FailureReport, EarliestOwnErrorWins) {
  TempDir d;
  error_record(d.path, 3, "error", 500, "all_reduce ... not contiguous");
  exit_record(d.path, 3, "exit", 1, 0, false, 510);
  error_record(d.path, 1, "config", 400, "config: train.lr must be > 0");
  exit_record(d.path, 1, "exit", 2, 0, false, 900);
  const auto rep = read_failure_report(d.path, 0, 4);
  ASSERT_TRUE(rep.culprit);
  EXPECT_EQ(rep.culprit->rank, 1) << "its error came first even though it exited last";
  EXPECT_EQ(rep.culprit->code, 2);
}

TEST(FailureReport, OnlyTimeoutsNameTheFirstAndSayWhy) {
  TempDir d;
  error_record(d.path, 0, "timeout", 700, "collective watchdog: all_reduce ...");
  exit_record(d.path, 0, "exit", 1, 0, false, 710);
  exit_record(d.path, 1, "signal", 143, 15, true, 720, 712);  // the stopped (hung) one
  const auto rep = read_failure_report(d.path, 0, 2);
  ASSERT_TRUE(rep.culprit);
  EXPECT_EQ(rep.culprit->rank, 0);
  EXPECT_NE(rep.text(d.path).find("no worker failed on its own"), std::string::npos);
}

TEST(FailureReport, AllOkSaysNothing) {
  TempDir d;
  exit_record(d.path, 0, "exit", 0, 0, false, 1);
  exit_record(d.path, 1, "exit", 0, 0, false, 2);
  const auto rep = read_failure_report(d.path, 0, 2);
  EXPECT_FALSE(rep.culprit);
  EXPECT_EQ(rep.text(d.path), "");
}
