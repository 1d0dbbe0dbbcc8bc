// engine/tokenizers/llama2c_tokenizer.h: the llama2.c tokenizer (tokenizer.bin, tok512.bin).
//
// File format (little-endian), as written by llama2.c's tokenizer.py export:
//   int32 max_token_length
//   vocab_size x { float32 score; int32 len; len bytes (the piece, no terminator) }
// Ids 0, 1, 2 are <unk>, BOS, EOS; ids 3..258 are the byte pieces <0x00>..<0xFF> (byte fallback).
//
// Encode is run.c's encode() exactly: BOS (when asked), a dummy-prefix " " when the text is
// non-empty, one token per UTF-8 codepoint found in the vocabulary (at most 4 bytes, as run.c
// groups them) or else one byte token (byte + 3) per byte, then repeated greedy merging of the
// adjacent pair whose concatenation has the highest score (strictly above -1e10; ties go to the
// leftmost pair). The BOS token takes part in merging as in run.c. Merging uses a priority queue,
// O(n log n), which picks the same pair as run.c's quadratic scan at every step.
// Differences from run.c, all on inputs run.c cannot handle: a NUL byte in the text is encoded
// (byte fallback) instead of ending it; a vocabulary without " " encodes the dummy prefix as a
// byte token; among duplicate pieces the lowest id is used (run.c's bsearch picks any).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "engine/tokenizer.h"
#include "schema/status.h"

namespace bitroll::engine {

// Loads a llama2.c tokenizer file. `expected_vocab_size` is the model's vocabulary size; 0 accepts
// any size. Errors: kNotFound (no file), kIoError (unreadable), kCorruption (truncated or
// malformed: negative length, partial entry), kInvalidArgument (the file's token count differs
// from expected_vocab_size: "tokenizer has 512 tokens, model expects 32000").
Result<std::unique_ptr<Tokenizer>> LoadLlama2cTokenizer(const std::string& path,
                                                        int32_t expected_vocab_size);

// Builds the same tokenizer from in-memory pieces (e.g. a GGUF file's SentencePiece vocabulary,
// with "▁" already replaced by " "). Differences from the file form: BOS/EOS are `bos_id` /
// `eos_id`, and byte fallback uses the pieces spelled "<0x00>".."<0xFF>" wherever they are (a
// byte without its piece makes Encode fail with kUnsupported). A piece whose score is not above
// -1e10 is never produced by a merge. Errors: kInvalidArgument (no pieces, pieces/scores of
// different lengths, bos/eos outside the vocabulary).
Result<std::unique_ptr<Tokenizer>> MakeLlama2cTokenizer(std::vector<std::string> pieces,
                                                        std::vector<float> scores, int32_t bos_id,
                                                        int32_t eos_id);

}  // namespace bitroll::engine
