// rollout/progress.h: the progress line of long CLI work (`generate --prompts`,
// `update-weights --stream`): done/total, rate and ETA, on a terminal only.
//
// FormatProgress is a pure function of the counts and the elapsed time. ProgressLine draws it
// with a carriage return on `out`, only when `out` is a terminal (isatty): into a pipe or a file
// (scripts, tests, CI logs) it writes nothing at all.
//
// Thread-safety: FormatProgress is pure; a ProgressLine is used by one thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace bitroll::rollout {

// What is counted: its name and how many counted things make one shown unit (1e6 shows bytes as
// MB with one decimal; 1 shows whole numbers).
struct ProgressUnit {
  std::string_view name = "items";
  double scale = 1.0;
};

// "LABEL: DONE/TOTAL UNIT (P%), RATE UNIT/s, ETA D", e.g.
// "generate: 120/1000 trajectories (12%), 35.2 trajectories/s, ETA 25s". Rate and ETA read "-"
// until there is a rate (done > 0 and elapsed_s > 0); the ETA is 0s once done >= total.
// total <= 0 (unknown): "LABEL: DONE UNIT, RATE UNIT/s".
std::string FormatProgress(std::string_view label, int64_t done, int64_t total, double elapsed_s,
                           ProgressUnit unit = {});

// A duration as "45s", "3m07s" or "2h05m" (negative or not finite: "-").
std::string FormatDuration(double seconds);

class ProgressLine {
 public:
  // Draws on `out` only if isatty(fileno(out)). min_interval bounds how often it redraws.
  ProgressLine(std::string label, int64_t total, ProgressUnit unit = {}, FILE* out = stderr,
               std::chrono::milliseconds min_interval = std::chrono::milliseconds(100));
  ~ProgressLine();  // Finish()
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;

  bool enabled() const { return enabled_; }
  // Records `done`; redraws when min_interval has passed since the last draw (or at the total).
  void Update(int64_t done);
  // Draws the last count once more and ends the line; later calls do nothing.
  void Finish();

 private:
  void Draw();

  std::string label_;
  int64_t total_;
  ProgressUnit unit_;
  FILE* out_;
  std::chrono::milliseconds min_interval_;
  bool enabled_;
  bool drawn_ = false;
  bool finished_ = false;
  int64_t done_ = 0;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace bitroll::rollout
