// Test-only helpers shared by the wal/ tests: temporary directories, deterministic content and a
// canonical byte dump of a TrajectoryLog (so that logs are compared with memcmp, bit for bit).
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "wal/wal.h"

namespace bitroll::wal::testing {

// A fresh directory under the system temp dir, removed on destruction.
class TempDir {
 public:
  explicit TempDir(const std::string& tag) {
    std::string tmpl = (std::filesystem::temp_directory_path() / ("bitroll_" + tag + "_XXXXXX"));
    char* p = mkdtemp(tmpl.data());
    path_ = p ? p : "";
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string Sub(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline uint64_t Mix(uint64_t x) {  // splitmix64
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Deterministic token content: id and logprob bits of token i of trajectory traj.
inline int32_t TokenId(uint64_t traj, uint32_t i) {
  return static_cast<int32_t>(Mix(traj * 1000003 + i) % 151936);
}
inline float TokenLogprob(uint64_t traj, uint32_t i) {
  // Negative finite floats with arbitrary mantissas: exercise every bit of the fp32 payload.
  uint32_t bits = static_cast<uint32_t>(Mix(~traj * 7919 + i));
  bits = (bits & 0x007FFFFFu) | (static_cast<uint32_t>(100 + (bits >> 25)) << 23) | 0x80000000u;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline TrajectoryHeader MakeHeader(uint64_t traj) {
  TrajectoryHeader h;
  h.request = "request-bytes-" + std::to_string(traj) + std::string("\0\x01\xff", 3);
  h.group_id = traj / 4;
  h.sample_index = static_cast<uint32_t>(traj % 4);
  h.sampling.seed = Mix(traj);
  h.sampling = {0.7f, 40, 0.95f, 0.05f};
  h.max_tokens = 4096;
  h.weight_version = 3;
  h.fingerprint = {0xFEEDFACECAFEBEEFull, 2, 64, "cpu"};
  return h;
}

template <typename T>
void PutPod(std::string& out, const T& v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}
inline void PutStr(std::string& out, const std::string& s) {
  PutPod(out, static_cast<uint64_t>(s.size()));
  out += s;
}

// Every field of a header, in a fixed order, as raw bytes.
inline std::string Dump(const TrajectoryHeader& h) {
  std::string o;
  PutStr(o, h.request);
  PutPod(o, h.group_id);
  PutPod(o, h.sample_index);
  PutPod(o, h.sampling.seed);
  PutPod(o, h.sampling.temperature);
  PutPod(o, h.sampling.top_k);
  PutPod(o, h.sampling.top_p);
  PutPod(o, h.sampling.min_p);
  PutPod(o, h.max_tokens);
  PutPod(o, h.weight_version);
  PutPod(o, h.fingerprint.weights_hash);
  PutPod(o, h.fingerprint.kernel_version);
  PutPod(o, h.fingerprint.attention_chunk);
  PutStr(o, h.fingerprint.backend);
  return o;
}

// Every field of a log (record/byte counters excluded), in a fixed order, as raw bytes.
inline std::string Dump(const TrajectoryLog& l) {
  std::string o;
  PutPod(o, l.id);
  o += Dump(l.header);
  PutPod(o, static_cast<uint64_t>(l.token_ids.size()));
  o.append(reinterpret_cast<const char*>(l.token_ids.data()), 4 * l.token_ids.size());
  PutPod(o, static_cast<uint64_t>(l.logprobs.size()));
  o.append(reinterpret_cast<const char*>(l.logprobs.data()), 4 * l.logprobs.size());
  for (const TokenSpan& s : l.spans) {
    PutPod(o, s.first_token);
    PutPod(o, s.count);
    PutPod(o, s.weight_version);
  }
  for (const TurnBoundary& t : l.turns) {
    PutPod(o, t.turn_index);
    PutPod(o, t.token_index);
    PutPod(o, static_cast<uint64_t>(t.injected_tokens.size()));
    o.append(reinterpret_cast<const char*>(t.injected_tokens.data()), 4 * t.injected_tokens.size());
  }
  for (const ToolCallLog& c : l.tool_calls) {
    PutPod(o, c.call.call_index);
    PutPod(o, c.call.token_index);
    PutStr(o, c.call.tool_name);
    PutPod(o, c.call.tier);
    PutStr(o, c.call.input);
    PutPod(o, c.result.has_value());
    if (c.result) {
      const ToolResult& r = *c.result;
      PutPod(o, r.call_index);
      PutPod(o, r.exit_status);
      PutStr(o, r.stdout_bytes);
      PutStr(o, r.stderr_bytes);
      PutPod(o, r.stdout_truncated);
      PutPod(o, r.stderr_truncated);
      PutPod(o, r.wall_seconds);
      PutPod(o, r.cpu_seconds);
      PutPod(o, r.error_code);
      PutStr(o, r.error_message);
    }
  }
  PutPod(o, l.finish.has_value());
  if (l.finish) {
    PutPod(o, l.finish->reason);
    PutStr(o, l.finish->error);
  }
  return o;
}

// Appends tokens [from, to) of traj (TokenId/TokenLogprob) in batches of `batch` with weight
// version wv, and mirrors them into *expect when it is not null.
inline Status AppendTokenRange(Wal& w, uint64_t traj, uint32_t from, uint32_t to, uint32_t batch,
                               uint64_t wv, TrajectoryLog* expect) {
  for (uint32_t i = from; i < to; i += batch) {
    std::vector<int32_t> ids;
    std::vector<float> lps;
    for (uint32_t j = i; j < to && j < i + batch; ++j) {
      ids.push_back(TokenId(traj, j));
      lps.push_back(TokenLogprob(traj, j));
    }
    BR_RETURN_IF_ERROR(w.AppendTokens(traj, ids, lps, wv));
    if (expect != nullptr) {
      expect->spans.push_back({i, static_cast<uint32_t>(ids.size()), wv});
      expect->token_ids.insert(expect->token_ids.end(), ids.begin(), ids.end());
      expect->logprobs.insert(expect->logprobs.end(), lps.begin(), lps.end());
    }
  }
  return Status::Ok();
}

// Header + `tokens` tokens in batches of 16 (+ finish), mirrored into *expect (from the inputs,
// never read back from the WAL).
inline Status WriteTrajectory(Wal& w, uint64_t traj, uint32_t tokens, bool finish,
                              TrajectoryLog* expect) {
  TrajectoryLog local;
  TrajectoryLog& e = expect ? *expect : local;
  e.id = traj;
  e.header = MakeHeader(traj);
  BR_RETURN_IF_ERROR(w.AppendHeader(traj, e.header));
  BR_RETURN_IF_ERROR(AppendTokenRange(w, traj, 0, tokens, 16, 1, &e));
  if (finish) {
    BR_RETURN_IF_ERROR(w.AppendFinish(traj, FinishReason::kLength, ""));
    e.finish = FinishRecord{FinishReason::kLength, ""};
  }
  return Status::Ok();
}

// memcmp of two dumps, with a readable failure.
inline bool SameBytes(const std::string& a, const std::string& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace bitroll::wal::testing
