// engine/tokenizers/bpe_tokenizer.h: Hugging Face tokenizer.json byte-level BPE (GPT-2, Llama-3,
// Qwen2/3, DeepSeek-V3 style), encode and decode.
//
// Supported tokenizer.json subset (anything else is kUnsupported, never silently approximated):
//   model       {"type": "BPE", vocab, merges, ignore_merges}. merges are "a b" strings or
//               ["a", "b"] pairs; rank = position in the list (lowest rank merges first).
//               dropout must be null, continuing_subword_prefix/end_of_word_suffix empty.
//   normalizer  null, NFC, or an empty Sequence. NFC is treated as the identity: exact for ASCII
//               and for text that is already NFC (nearly all text); a decomposed sequence (e.g.
//               "e" + U+0301) is encoded as given where HF would compose it first.
//   pre_tokenizer  Split {pattern: Regex|String, behavior: Isolated|Removed|MergedWithPrevious|
//               MergedWithNext|Contiguous, invert}, Digits {individual_digits}, ByteLevel
//               {add_prefix_space, use_regex (GPT-2 pattern)}, or a Sequence of them; it must
//               contain ByteLevel, and no Split/Digits may follow it. Regexes run on PCRE2 with
//               PCRE2_UTF | PCRE2_UCP (JIT when available) where HF uses Oniguruma; the patterns
//               of GPT-2/Llama-3/Qwen/DeepSeek mean the same in both.
//   added_tokens   matched in the text before anything else, leftmost-longest; tokens with
//               normalized=false first on the raw text, then normalized=true ones in the gaps (HF's
//               order). lstrip/rstrip swallow adjacent whitespace; single_word uses ASCII word
//               characters [A-Za-z0-9_].
//   post_processor null, ByteLevel (no BOS), TemplateProcessing whose single-sequence template
//               is at most one special token before $A (that token is BOS), or a Sequence of them.
//   decoder     ByteLevel (or null): each token's characters map back through GPT-2's
//               bytes_to_unicode table; a token with a character outside it (e.g. an added token
//               such as "<｜begin▁of▁sentence｜>") decodes to its own UTF-8, as in HF.
//
// BOS/EOS: the options' bos_token/eos_token, else the post_processor's BOS, else bos_token and
// eos_token of tokenizer_config.json (read from beside tokenizer.json when present). A tokenizer
// without BOS (Qwen) has bos_id() == -1 and Encode(text, add_bos=true) adds nothing; likewise
// eos_id() == -1 when no EOS is named anywhere.
//
// Bytes that are not valid UTF-8 (HF cannot take them) never fail: each maximal run of invalid
// bytes is its own pre-token and is encoded from byte tokens, so Decode(Encode(x)) == x for any x
// (except whitespace swallowed by an added token's lstrip/rstrip, as in HF).
//
// Checked token for token against Hugging Face tokenizers 0.22 on the Qwen3, Llama-3 and
// DeepSeek-V3 tokenizer.json files (bpe_tokenizer_test; scripts/fetch-test-tokenizers.sh).
//
// vocab_size() is the largest id (vocab or added token) + 1. DecodePiece(prev, token) is the
// token's own bytes whatever `prev` is; it may be a partial UTF-8 sequence. An id inside
// [0, vocab_size()) that names no token decodes to "".
//
// Thread-safety: the tokenizer is immutable after load except for its word cache, which is
// internally locked (sharded mutexes); every const method may be called concurrently. Results
// never depend on the cache's state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "engine/tokenizer.h"
#include "schema/status.h"

namespace bitroll::engine {

struct BpeTokenizerOptions {
  // tokenizer_config.json to read bos_token/eos_token from. "" (default): the file of that name
  // in the directory of tokenizer.json, if it exists; a missing default file is not an error, a
  // missing explicit one is kNotFound.
  std::string config_path;
  // Content of the token to use as BOS / EOS (e.g. "<|begin_of_text|>"), overriding the file.
  // "" (default): from post_processor / tokenizer_config.json as described above.
  std::string bos_token;
  std::string eos_token;
  // When true, special added tokens appearing in the text are encoded as ordinary text (HF's
  // split_special_tokens); non-special added tokens are still matched. Default false, as HF:
  // a prompt that contains "<|im_start|>" gets the special id.
  bool split_special_tokens = false;
  // Pre-tokens (words) shorter than 256 bytes whose BPE result is cached; 0 disables the cache.
  // Default 65536 words (a few MB): repeated words skip merging. The cache never changes results.
  size_t cache_capacity = 65536;
};

// Loads tokenizer.json at `path`. `expected_vocab_size` is the model's embedding size; 0 accepts
// any. The tokenizer may be smaller than the model (HF models pad their embeddings) but not larger.
// Errors: kNotFound (no file), kIoError (unreadable), kCorruption (malformed JSON, a merge naming
// a token missing from the vocabulary, a merge whose result is missing, duplicate ids, a regex
// PCRE2 rejects), kUnsupported (a model type, normalizer, pre-tokenizer or decoder outside the
// subset above), kInvalidArgument ("tokenizer.json has N tokens, model expects M"; a BOS/EOS
// token named in options or config that is not in the vocabulary).
Result<std::unique_ptr<Tokenizer>> LoadBpeTokenizer(const std::string& path,
                                                    int32_t expected_vocab_size);
Result<std::unique_ptr<Tokenizer>> LoadBpeTokenizer(const std::string& path,
                                                    int32_t expected_vocab_size,
                                                    const BpeTokenizerOptions& options);

// As LoadBpeTokenizer, from memory: `json` is the tokenizer.json text, `config_json` the
// tokenizer_config.json text or "" for none (options.config_path is ignored). `name` prefixes
// error messages.
Result<std::unique_ptr<Tokenizer>> ParseBpeTokenizer(std::string_view json,
                                                     std::string_view config_json,
                                                     int32_t expected_vocab_size,
                                                     const BpeTokenizerOptions& options,
                                                     const std::string& name = "tokenizer.json");

}  // namespace bitroll::engine
