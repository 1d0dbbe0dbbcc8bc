// rollout/progress.cc: see progress.h.
#include "rollout/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>

namespace bitroll::rollout {

namespace {

std::string Amount(int64_t n, const ProgressUnit& u) {
  char buf[64];
  if (u.scale == 1.0) {
    std::snprintf(buf, sizeof(buf), "%" PRId64, n);
  } else {
    std::snprintf(buf, sizeof(buf), "%.1f", static_cast<double>(n) / u.scale);
  }
  return buf;
}

}  // namespace

std::string FormatDuration(double s) {
  if (!std::isfinite(s) || s < 0) return "-";
  const int64_t t = static_cast<int64_t>(std::llround(s));
  char buf[64];
  if (t < 60) {
    std::snprintf(buf, sizeof(buf), "%" PRId64 "s", t);
  } else if (t < 3600) {
    std::snprintf(buf, sizeof(buf), "%" PRId64 "m%02" PRId64 "s", t / 60, t % 60);
  } else {
    std::snprintf(buf, sizeof(buf), "%" PRId64 "h%02" PRId64 "m", t / 3600, t / 60 % 60);
  }
  return buf;
}

std::string FormatProgress(std::string_view label, int64_t done, int64_t total, double elapsed_s,
                           ProgressUnit unit) {
  const std::string name(unit.name);
  std::string out(label);
  out += ": " + Amount(done, unit);
  if (total > 0) out += "/" + Amount(total, unit);
  out += " " + name;
  if (total > 0) {
    const double pct = 100.0 * static_cast<double>(std::min(done, total)) / total;
    char buf[32];
    std::snprintf(buf, sizeof(buf), " (%.0f%%)", std::floor(pct));
    out += buf;
  }
  const bool have_rate = done > 0 && elapsed_s > 0 && std::isfinite(elapsed_s);
  const double rate = have_rate ? static_cast<double>(done) / elapsed_s : 0.0;
  if (have_rate) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), ", %.1f %s/s", rate / unit.scale, name.c_str());
    out += buf;
  } else {
    out += ", - " + name + "/s";
  }
  if (total > 0) {
    if (done >= total) {
      out += ", ETA 0s";
    } else {
      out += ", ETA " + (have_rate ? FormatDuration((total - done) / rate) : std::string("-"));
    }
  }
  return out;
}

ProgressLine::ProgressLine(std::string label, int64_t total, ProgressUnit unit, FILE* out,
                           std::chrono::milliseconds min_interval)
    : label_(std::move(label)),
      total_(total),
      unit_(unit),
      out_(out),
      min_interval_(min_interval),
      enabled_(out != nullptr && isatty(fileno(out)) == 1),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

ProgressLine::~ProgressLine() {
  Finish();
}

void ProgressLine::Update(int64_t done) {
  done_ = done;
  if (!enabled_ || finished_) return;
  const auto now = std::chrono::steady_clock::now();
  if (!drawn_ || now - last_draw_ >= min_interval_ || (total_ > 0 && done >= total_)) Draw();
}

void ProgressLine::Finish() {
  if (finished_) return;
  finished_ = true;
  if (!enabled_) return;
  Draw();
  std::fputc('\n', out_);
  std::fflush(out_);
}

void ProgressLine::Draw() {
  last_draw_ = std::chrono::steady_clock::now();
  drawn_ = true;
  const double elapsed = std::chrono::duration<double>(last_draw_ - start_).count();
  // \r back to the line's start, \033[K clears what a longer earlier line left.
  std::fprintf(out_, "\r%s\033[K", FormatProgress(label_, done_, total_, elapsed, unit_).c_str());
  std::fflush(out_);
}

}  // namespace bitroll::rollout
