// The progress line: the formatter as a pure function, and the line itself on a real terminal
// (a pseudo-terminal) versus a pipe, where it must write nothing.
#include "rollout/progress.h"

#include <fcntl.h>
#include <poll.h>
#include <pty.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <limits>
#include <string>

namespace bitroll::rollout {
namespace {

TEST(ProgressFormat, CountsRateAndEta) {
  EXPECT_EQ(FormatProgress("generate", 120, 1000, 10.0, {"trajectories", 1}),
            "generate: 120/1000 trajectories (12%), 12.0 trajectories/s, ETA 1m13s");
  EXPECT_EQ(FormatProgress("generate", 0, 1000, 0.0, {"trajectories", 1}),
            "generate: 0/1000 trajectories (0%), - trajectories/s, ETA -");
  EXPECT_EQ(FormatProgress("generate", 1000, 1000, 4.0, {"trajectories", 1}),
            "generate: 1000/1000 trajectories (100%), 250.0 trajectories/s, ETA 0s");
  // Percent rounds down: 99.9% is not done.
  EXPECT_EQ(FormatProgress("x", 999, 1000, 1.0, {"items", 1}),
            "x: 999/1000 items (99%), 999.0 items/s, ETA 0s");
}

TEST(ProgressFormat, ScaledUnitsAndUnknownTotal) {
  EXPECT_EQ(FormatProgress("update-weights", 25'000'000, 100'000'000, 2.0, {"MB", 1e6}),
            "update-weights: 25.0/100.0 MB (25%), 12.5 MB/s, ETA 6s");
  EXPECT_EQ(FormatProgress("scan", 42, 0, 2.0, {"records", 1}), "scan: 42 records, 21.0 records/s");
}

TEST(ProgressFormat, Durations) {
  EXPECT_EQ(FormatDuration(0), "0s");
  EXPECT_EQ(FormatDuration(59.4), "59s");
  EXPECT_EQ(FormatDuration(187), "3m07s");
  EXPECT_EQ(FormatDuration(7500), "2h05m");
  EXPECT_EQ(FormatDuration(-1), "-");
  EXPECT_EQ(FormatDuration(std::numeric_limits<double>::infinity()), "-");
}

// Everything readable on fd within a short wait.
std::string Drain(int fd) {
  std::string out;
  char buf[4096];
  pollfd p{fd, POLLIN, 0};
  while (poll(&p, 1, 200) > 0 && (p.revents & POLLIN)) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

void Drive(FILE* f) {
  ProgressLine line("generate", 3, {"trajectories", 1}, f, std::chrono::milliseconds(0));
  for (int i = 0; i <= 3; ++i) line.Update(i);
}

TEST(ProgressLine, PipeGetsNothing) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  FILE* w = fdopen(fds[1], "w");
  ASSERT_NE(w, nullptr);
  {
    ProgressLine line("generate", 3, {"trajectories", 1}, w);
    EXPECT_FALSE(line.enabled());
  }
  Drive(w);
  std::fclose(w);
  EXPECT_EQ(Drain(fds[0]), "");
  close(fds[0]);
}

TEST(ProgressLine, TerminalGetsTheLine) {
  int master = -1, slave = -1;
  if (openpty(&master, &slave, nullptr, nullptr, nullptr) != 0) {
    GTEST_SKIP() << "SKIPPED LOUDLY: no pseudo-terminal here (openpty failed)";
  }
  FILE* w = fdopen(slave, "w");
  ASSERT_NE(w, nullptr);
  Drive(w);
  std::fclose(w);
  const std::string got = Drain(master);
  close(master);
  EXPECT_NE(got.find("\rgenerate: 0/3 trajectories"), std::string::npos) << got;
  EXPECT_NE(got.find("generate: 3/3 trajectories (100%)"), std::string::npos) << got;
  EXPECT_NE(got.find("ETA 0s"), std::string::npos) << got;
  // The line ends once (Finish), with the terminal's newline translation.
  EXPECT_TRUE(got.ends_with("\r\n") || got.ends_with("\n")) << got;
}

}  // namespace
}  // namespace bitroll::rollout
