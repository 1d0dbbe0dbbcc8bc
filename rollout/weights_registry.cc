// rollout/weights_registry.cc: <data-dir>/weights.jsonl (rollout/weights_registry.h).
#include "rollout/weights_registry.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

namespace bitroll::rollout {

std::string WeightsRegistryPath(const std::string& data_dir) {
  return (std::filesystem::path(data_dir) / "weights.jsonl").string();
}

nlohmann::json WeightsEntryToJson(const WeightsEntry& e) {
  nlohmann::json j = {{"version", e.version},
                      {"source", e.source},
                      {"weights_hash", fmt::format("{:016x}", e.weights_hash)},
                      {"unix_ms", e.unix_ms}};
  if (!e.path.empty()) j["path"] = e.path;
  return j;
}

Status AppendWeightsEntry(const std::string& file, const WeightsEntry& e) {
  WeightsEntry stamped = e;
  if (stamped.unix_ms == 0) {
    stamped.unix_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  }
  const std::string line =
      WeightsEntryToJson(stamped).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) +
      "\n";
  const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return Status::IoError("weights registry " + file + ": " + std::strerror(errno));
  const bool ok = ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size()) &&
                  ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  if (!ok) return Status::IoError("weights registry " + file + ": " + std::strerror(err));
  return Status::Ok();
}

namespace {

bool ParseHex64(const std::string& s, uint64_t* out) {
  if (s.size() != 16) return false;
  uint64_t v = 0;
  for (char c : s) {
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) return false;
    v = v << 4 | static_cast<uint64_t>(d);
  }
  *out = v;
  return true;
}

}  // namespace

Result<std::vector<WeightsEntry>> ReadWeightsRegistry(const std::string& file) {
  std::ifstream in(file);
  if (!in) return Status::NotFound("weights registry " + file + " cannot be opened");
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  std::vector<WeightsEntry> out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (lines[i].find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j = nlohmann::json::parse(lines[i], nullptr, /*allow_exceptions=*/false);
    WeightsEntry e;
    bool ok = j.is_object() && j.contains("version") && j["version"].is_number_unsigned() &&
              j.contains("weights_hash") && j["weights_hash"].is_string() &&
              ParseHex64(j["weights_hash"].get<std::string>(), &e.weights_hash);
    if (ok) {
      e.version = j["version"].get<uint64_t>();
      const auto str = [&](const char* k) {
        return j.contains(k) && j[k].is_string() ? j[k].get<std::string>() : std::string();
      };
      e.source = str("source");
      e.path = str("path");
      if (j.contains("unix_ms") && j["unix_ms"].is_number_integer()) {
        e.unix_ms = j["unix_ms"].get<int64_t>();
      }
    }
    if (!ok) {
      if (i + 1 == lines.size()) break;  // a torn last line: the update was never acknowledged
      return Status::Corruption("weights registry " + file + ": line " + std::to_string(i + 1) +
                                " is not a weights entry");
    }
    out.push_back(std::move(e));
  }
  return out;
}

std::optional<WeightsEntry> FindWeightsVersion(const std::vector<WeightsEntry>& entries,
                                               uint64_t version,
                                               std::optional<uint64_t> prefer_hash) {
  std::optional<WeightsEntry> last, preferred;
  for (const WeightsEntry& e : entries) {
    if (e.version != version) continue;
    last = e;
    if (prefer_hash && e.weights_hash == *prefer_hash) preferred = e;
  }
  return preferred ? preferred : last;
}

namespace {

std::string Absolute(const std::string& path) {
  if (path.empty()) return path;
  std::error_code ec;
  const std::filesystem::path abs = std::filesystem::absolute(path, ec);
  return ec ? path : abs.lexically_normal().string();
}

}  // namespace

Status RecordWeightsVersion(const std::string& data_dir, uint64_t version,
                            const std::string& source, const std::string& path,
                            uint64_t weights_hash) {
  std::error_code ec;
  std::filesystem::create_directories(data_dir, ec);
  WeightsEntry e;
  e.version = version;
  e.source = source;
  e.path = Absolute(path);
  e.weights_hash = weights_hash;
  return AppendWeightsEntry(WeightsRegistryPath(data_dir), e);
}

uint64_t RegisteredWeightsHash(const std::string& data_dir, uint64_t version) {
  Result<std::vector<WeightsEntry>> r = ReadWeightsRegistry(WeightsRegistryPath(data_dir));
  if (!r.ok()) return 0;
  std::optional<WeightsEntry> e = FindWeightsVersion(*r, version);
  return e ? e->weights_hash : 0;
}

Status RecordInitialWeights(const std::string& data_dir, const std::string& path,
                            uint64_t weights_hash) {
  const std::string p = Absolute(path);
  if (Result<std::vector<WeightsEntry>> r = ReadWeightsRegistry(WeightsRegistryPath(data_dir));
      r.ok()) {
    std::optional<WeightsEntry> e = FindWeightsVersion(*r, 0);
    if (e && e->path == p && e->weights_hash == weights_hash) return Status::Ok();
  }
  return RecordWeightsVersion(data_dir, 0, "initial", p, weights_hash);
}

}  // namespace bitroll::rollout
