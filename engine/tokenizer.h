// engine/tokenizer.h: the tokenizer interface shared by every model format.
//
// A Tokenizer turns text into token ids (Encode) and token ids back into bytes (DecodePiece,
// Decode). Decoding is piecewise because a piece's bytes can depend on the previous token
// (SentencePiece strips the leading space of the first piece after BOS).
//
// Ownership: a Tokenizer owns its vocabulary; it holds no pointer into caller memory.
// Thread-safety: immutable after load; every const method may be called concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "schema/status.h"

namespace bitroll::engine {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  virtual int32_t vocab_size() const = 0;
  virtual int32_t bos_id() const = 0;
  virtual int32_t eos_id() const = 0;

  // Encodes `text` (any bytes; UTF-8 expected) and prepends BOS when `add_bos`. Never fails on
  // valid UTF-8 or raw bytes: a codepoint missing from the vocabulary falls back to byte tokens.
  // Errors: kUnsupported only when the vocabulary has no byte tokens to fall back to.
  virtual Result<std::vector<int32_t>> Encode(std::string_view text, bool add_bos) const = 0;

  // The bytes `token` contributes when it follows `prev` (llama2.c run.c's decode(): the leading
  // space of a piece that follows BOS is stripped, and a <0xXX> piece becomes the raw byte XX).
  // `prev` may be any value (e.g. -1 for "no previous token").
  // Errors: kOutOfRange for a `token` outside [0, vocab_size()).
  virtual Result<std::string> DecodePiece(int32_t prev, int32_t token) const = 0;

  // The concatenated pieces of `ids`, the first one following `prev` (the full detokenization;
  // no PrintablePiece filtering). Errors: those of DecodePiece.
  Result<std::string> Decode(std::span<const int32_t> ids, int32_t prev) const;
};

// llama2.c run.c's safe_printf() rule, as the bytes it would print: the piece up to its first NUL
// byte (printf("%s") stops there), or "" when that is a single byte that is neither printable nor
// whitespace in the C locale (isprint/isspace).
std::string PrintablePiece(std::string_view piece);

// Reads a whole tokenizer file into `out`. Errors: kNotFound ("no tokenizer file PATH"), kIoError.
Status ReadTokenizerFile(const std::string& path, std::string* out);

}  // namespace bitroll::engine
