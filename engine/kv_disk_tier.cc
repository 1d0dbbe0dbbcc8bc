#include "engine/kv_disk_tier.h"

#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>
#include <vector>

namespace bitroll::engine {

namespace {

namespace fs = std::filesystem;

constexpr char kMagic[8] = {'B', 'R', 'K', 'V', 'B', 'L', 'K', '1'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderBytes = 32;

bool ParseHashName(const std::string& name, uint64_t* hash) {
  if (name.size() != 20 || name.substr(16) != ".kvb") return false;
  uint64_t h = 0;
  for (int i = 0; i < 16; ++i) {
    const char c = name[i];
    int d;
    if (c >= '0' && c <= '9')
      d = c - '0';
    else if (c >= 'a' && c <= 'f')
      d = c - 'a' + 10;
    else
      return false;
    h = h << 4 | static_cast<uint64_t>(d);
  }
  *hash = h;
  return true;
}

}  // namespace

Result<std::unique_ptr<KvDiskTier>> KvDiskTier::Open(const KvDiskTierOptions& options,
                                                     int32_t block_size, int64_t payload_floats) {
  if (options.dir.empty()) return Status::InvalidArgument("kv disk tier: empty directory");
  if (block_size <= 0 || payload_floats <= 0 || options.max_bytes < 0) {
    return Status::InvalidArgument("kv disk tier: bad block size, payload or max_bytes");
  }
  std::error_code ec;
  fs::create_directories(options.dir, ec);
  if (ec)
    return Status::IoError("kv disk tier: cannot create " + options.dir + ": " + ec.message());
  std::unique_ptr<KvDiskTier> t(new KvDiskTier());
  t->opt_ = options;
  t->block_size_ = block_size;
  t->payload_floats_ = payload_floats;
  t->file_bytes_ = static_cast<int64_t>(kHeaderBytes + sizeof(int32_t) * block_size +
                                        sizeof(float) * payload_floats + sizeof(uint64_t));
  // Files of an earlier run, oldest first. Their contents are verified on Get().
  std::vector<std::pair<fs::file_time_type, uint64_t>> found;
  for (const fs::directory_entry& e : fs::directory_iterator(options.dir, ec)) {
    uint64_t h;
    if (!e.is_regular_file(ec) || !ParseHashName(e.path().filename().string(), &h)) continue;
    found.emplace_back(e.last_write_time(ec), h);
  }
  if (ec) return Status::IoError("kv disk tier: cannot list " + options.dir + ": " + ec.message());
  std::sort(found.begin(), found.end());
  for (const auto& [time, h] : found) {
    t->lru_.push_back(h);
    t->index_[h] = std::prev(t->lru_.end());
    t->stats_.bytes += t->file_bytes_;
    ++t->stats_.files;
  }
  t->EnforceCap();
  return t;
}

std::string KvDiskTier::PathFor(uint64_t hash) const {
  char name[32];
  std::snprintf(name, sizeof(name), "%016llx.kvb", static_cast<unsigned long long>(hash));
  return (fs::path(opt_.dir) / name).string();
}

void KvDiskTier::Touch(uint64_t hash) {
  auto it = index_.find(hash);
  if (it != index_.end()) lru_.splice(lru_.end(), lru_, it->second);
}

void KvDiskTier::Forget(uint64_t hash, bool unlink) {
  auto it = index_.find(hash);
  if (it == index_.end()) return;
  lru_.erase(it->second);
  index_.erase(it);
  stats_.bytes -= file_bytes_;
  --stats_.files;
  if (unlink) {
    std::error_code ec;
    fs::remove(PathFor(hash), ec);
  }
}

void KvDiskTier::EnforceCap() {
  while (!lru_.empty() && stats_.bytes > opt_.max_bytes) {
    Forget(lru_.front(), /*unlink=*/true);
    ++stats_.evictions;
  }
}

Status KvDiskTier::Put(uint64_t hash, std::span<const int32_t> tokens, const float* payload) {
  if (static_cast<int32_t>(tokens.size()) != block_size_) {
    return Status::InvalidArgument("kv disk tier: block of " + std::to_string(tokens.size()) +
                                   " tokens, expected " + std::to_string(block_size_));
  }
  if (index_.count(hash) != 0) {
    Touch(hash);
    return Status::Ok();
  }
  if (file_bytes_ > opt_.max_bytes) return Status::Ok();  // the cap holds no block at all
  std::vector<char> buf(static_cast<size_t>(file_bytes_));
  char* p = buf.data();
  const uint32_t n = static_cast<uint32_t>(block_size_);
  const uint64_t payload_bytes = sizeof(float) * static_cast<uint64_t>(payload_floats_);
  std::memcpy(p, kMagic, 8);
  std::memcpy(p + 8, &kVersion, 4);
  std::memcpy(p + 12, &n, 4);
  std::memcpy(p + 16, &hash, 8);
  std::memcpy(p + 24, &payload_bytes, 8);
  std::memcpy(p + kHeaderBytes, tokens.data(), sizeof(int32_t) * n);
  std::memcpy(p + kHeaderBytes + sizeof(int32_t) * n, payload, payload_bytes);
  const size_t body = buf.size() - sizeof(uint64_t);
  const uint64_t sum = XXH64(p, body, 0);
  std::memcpy(p + body, &sum, sizeof(sum));

  const std::string path = PathFor(hash);
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) return Status::IoError("kv disk tier: cannot create " + tmp);
  const bool wrote = std::fwrite(buf.data(), 1, buf.size(), f) == buf.size();
  const bool closed = std::fclose(f) == 0;
  std::error_code ec;
  if (!wrote || !closed) {
    fs::remove(tmp, ec);
    return Status::IoError("kv disk tier: cannot write " + tmp);
  }
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    return Status::IoError("kv disk tier: cannot rename " + tmp + ": " + ec.message());
  }
  lru_.push_back(hash);
  index_[hash] = std::prev(lru_.end());
  stats_.bytes += file_bytes_;
  ++stats_.files;
  ++stats_.puts;
  EnforceCap();
  return Status::Ok();
}

bool KvDiskTier::Get(uint64_t hash, std::span<const int32_t> tokens, float* payload) {
  if (index_.count(hash) == 0 || static_cast<int32_t>(tokens.size()) != block_size_) {
    ++stats_.misses;
    return false;
  }
  std::vector<char> buf(static_cast<size_t>(file_bytes_) + 1);
  size_t got = 0;
  if (std::FILE* f = std::fopen(PathFor(hash).c_str(), "rb")) {
    got = std::fread(buf.data(), 1, buf.size(), f);  // one byte more than expected: detects growth
    std::fclose(f);
  }
  const char* p = buf.data();
  const uint32_t n = static_cast<uint32_t>(block_size_);
  const uint64_t payload_bytes = sizeof(float) * static_cast<uint64_t>(payload_floats_);
  const size_t body = static_cast<size_t>(file_bytes_) - sizeof(uint64_t);
  bool ok = got == static_cast<size_t>(file_bytes_) && std::memcmp(p, kMagic, 8) == 0;
  if (ok) {
    uint32_t version, n_tokens;
    uint64_t h, pb, sum;
    std::memcpy(&version, p + 8, 4);
    std::memcpy(&n_tokens, p + 12, 4);
    std::memcpy(&h, p + 16, 8);
    std::memcpy(&pb, p + 24, 8);
    std::memcpy(&sum, p + body, 8);
    ok = version == kVersion && n_tokens == n && h == hash && pb == payload_bytes &&
         std::memcmp(p + kHeaderBytes, tokens.data(), sizeof(int32_t) * n) == 0 &&
         XXH64(p, body, 0) == sum;
  }
  if (!ok) {
    // A torn, truncated or corrupted file (or a hash collision: other tokens) is a miss.
    ++stats_.corrupt;
    ++stats_.misses;
    Forget(hash, /*unlink=*/true);
    return false;
  }
  std::memcpy(payload, p + kHeaderBytes + sizeof(int32_t) * n, payload_bytes);
  Touch(hash);
  ++stats_.hits;
  return true;
}

}  // namespace bitroll::engine
