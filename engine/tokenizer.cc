// engine/tokenizer.cc: format-independent parts of the Tokenizer interface.
#include "engine/tokenizer.h"

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace bitroll::engine {

Result<std::string> Tokenizer::Decode(std::span<const int32_t> ids, int32_t prev) const {
  std::string out;
  for (int32_t id : ids) {
    BR_ASSIGN_OR_RETURN(std::string piece, DecodePiece(prev, id));
    out += piece;
    prev = id;
  }
  return out;
}

namespace {
// The C locale's isprint() and isspace(), spelled out so no locale can change them.
bool IsPrintC(unsigned char c) {
  return c >= 0x20 && c <= 0x7e;
}
bool IsSpaceC(unsigned char c) {
  return c == ' ' || (c >= '\t' && c <= '\r');
}
}  // namespace

std::string PrintablePiece(std::string_view piece) {
  const size_t nul = piece.find('\0');
  if (nul != std::string_view::npos) piece = piece.substr(0, nul);
  if (piece.size() == 1) {
    const auto c = static_cast<unsigned char>(piece[0]);
    if (!(IsPrintC(c) || IsSpaceC(c))) return std::string();
  }
  return std::string(piece);
}

Status ReadTokenizerFile(const std::string& path, std::string* out) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    const int err = errno;
    if (err == ENOENT) return Status::NotFound("no tokenizer file " + path);
    return Status::IoError("cannot open " + path + ": " + std::strerror(err));
  }
  out->clear();
  char chunk[1 << 16];
  size_t n;
  while ((n = std::fread(chunk, 1, sizeof(chunk), f)) > 0) out->append(chunk, n);
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) return Status::IoError("read error on " + path);
  return Status::Ok();
}

}  // namespace bitroll::engine
