// bitroll generate: run prompts through the engine on this machine and print the trajectories.
//
//   bitroll generate --model stories260K.bin --prompt "Once upon a time" [-n 4] [--json]
//
// Text output follows llama2.c run.c (prompt, then the generated pieces, then a newline), so a
// greedy run compares byte for byte with the reference. --json prints one object per trajectory
// with ids, logprobs (and their exact bits), finish reason, cost and the numerics fingerprint.
#include <sys/resource.h>

#include <cfloat>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/cpu_engine.h"
#include "engine/model_loader.h"
#include "engine/sampler.h"
#include "rollout/cli_args.h"
#include "rollout/commands.h"

namespace bitroll::rollout {

namespace {

constexpr const char* kUsage = R"(usage: bitroll generate --model PATH [options]

  --model PATH           llama2.c checkpoint (.bin); env BITROLL_MODEL is the default
  --tokenizer PATH       llama2.c tokenizer (default: tokenizer.bin or tok<vocab>.bin beside the model)
  --prompt TEXT          one prompt (default "Once upon a time")
  --prompts FILE         JSONL: one prompt per line, {"prompt": "..."} or {"ids": [1, 2, ...]}
  -n N                   samples per prompt (default 1); sample i uses noise stream i
  --max-tokens N         tokens to generate per sample (default: fill --steps)
  --steps N              llama2.c run.c's -n: total positions incl. the prompt (default 256)
  --temperature T        0 = greedy, else >= 1e-6 (default 1.0); a positive T below 1e-6 is
                         refused (logits / T overflows fp32): pass 0 for greedy
  --top-p P              nucleus sampling, in (0, 1] (default 0.9)
  --top-k K              keep the K most likely, 0 = off (default 0)
  --min-p P              in [0, 1], 0 = off (default 0)
  --seed S               any integer in [0, 2^64 - 1], as the wire seed (default 42)
  --device NAME          cpu|cuda (default cpu): cuda runs the forward pass on the GPU (weights
                         and KV cache on the device; a different numerics fingerprint)
  --threads N            kernel threads (default 1); never changes a bit
  --isa NAME             auto|scalar|avx2|avx512 (default auto); never changes a bit
  --attention NAME       auto|single|split (default auto); never changes a bit
  --max-step-tokens N    token budget of one engine step (default 512)
  --kv-cache-mb N        KV cache budget (default 256)
  --weights f32|bf16     CPU matmul weight storage (bf16 halves memory traffic; different
                         numerics); --device cuda always keeps bf16 weights on the GPU
  --json                 one JSON object per trajectory on stdout
)";

std::string Hex32(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%08" PRIx32, u);
  return buf;
}

// A flag's double as the float the engine takes: out of float's range is infinite (then refused
// by the validation) rather than the undefined behaviour of the cast.
float ToFloat(double d) {
  if (d > static_cast<double>(FLT_MAX)) return INFINITY;
  if (d < -static_cast<double>(FLT_MAX)) return -INFINITY;
  return static_cast<float>(d);
}

long PeakRssKb() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss;
}

struct Prompt {
  std::string text;  // empty when given as ids
  std::vector<int32_t> ids;
};

Status ReadPrompts(const std::string& path, const engine::Tokenizer* tok,
                   std::vector<Prompt>* out) {
  std::ifstream f(path);
  if (!f) return Status::NotFound("prompts file " + path + " cannot be opened");
  std::string line;
  int lineno = 0;
  while (std::getline(f, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    Prompt p;
    if (j.is_string()) {
      p.text = j.get<std::string>();
    } else if (j.is_object() && j.contains("prompt") && j["prompt"].is_string()) {
      p.text = j["prompt"].get<std::string>();
    } else if (j.is_object() && j.contains("ids") && j["ids"].is_array()) {
      for (const auto& x : j["ids"]) {
        if (!x.is_number_integer()) {
          return Status::InvalidArgument(path + ":" + std::to_string(lineno) +
                                         ": ids must be integers");
        }
        p.ids.push_back(x.get<int32_t>());
      }
    } else {
      return Status::InvalidArgument(path + ":" + std::to_string(lineno) +
                                     ": expected a string, {\"prompt\": ...} or {\"ids\": [...]}");
    }
    out->push_back(std::move(p));
  }
  if (out->empty()) return Status::InvalidArgument("prompts file " + path + " holds no prompt");
  return Status::Ok();
}

}  // namespace

int CmdGenerate(int argc, char** argv) {
  CliArgs args(argc, argv, 1);
  if (args.Has("help") || args.Has("h")) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  engine::EngineOptions eo;
  const char* env_model = std::getenv("BITROLL_MODEL");
  eo.model_path = args.String("model", env_model != nullptr ? env_model : "");
  eo.tokenizer_path = args.String("tokenizer", "");
  eo.device = args.String("device", "cpu");
  eo.threads = args.Int("threads", 1);
  eo.isa = args.String("isa", "auto");
  eo.attention = args.String("attention", "auto");
  eo.max_step_tokens = args.Int("max-step-tokens", 512);
  eo.kv_cache_bytes = args.Int("kv-cache-mb", 256) * (int64_t{1} << 20);
  const std::string weights = args.String("weights", "f32");
  const int n = args.Int("n", 1);
  const int steps = args.Int("steps", 256);
  const int max_tokens_flag = args.Int("max-tokens", 0);
  const bool json = args.Bool("json");
  engine::SamplingParams sp;
  sp.temperature = ToFloat(args.Double("temperature", 1.0));
  sp.top_p = ToFloat(args.Double("top-p", 0.9));
  const int64_t top_k = args.Int("top-k", 0);
  sp.min_p = ToFloat(args.Double("min-p", 0.0));
  sp.seed = args.Uint64("seed", 42);
  const std::string prompt_text = args.String("prompt", "Once upon a time");
  const std::string prompts_file = args.String("prompts", "");
  if (Status s = args.Finish(); !s.ok()) {
    std::fprintf(stderr, "bitroll generate: %s\n%s", s.ToString().c_str(), kUsage);
    return 2;
  }
  if (top_k < 0 || top_k > INT32_MAX) {
    std::fprintf(stderr,
                 "bitroll generate: --top-k: top_k must be in [0, 2147483647], got %" PRId64 "\n",
                 top_k);
    return 2;
  }
  sp.top_k = static_cast<int32_t>(top_k);
  if (Status s = engine::ValidateSamplingParams(sp); !s.ok()) {
    std::fprintf(stderr, "bitroll generate: %s\n", s.ToString().c_str());
    return 2;
  }
  if (eo.model_path.empty()) {
    std::fprintf(stderr, "bitroll generate: --model is required (or set BITROLL_MODEL)\n");
    return 2;
  }
  if (n < 1 || n > 100000 || steps < 2 || max_tokens_flag < 0 ||
      (weights != "f32" && weights != "bf16")) {
    std::fprintf(stderr,
                 "bitroll generate: -n must be in [1, 100000], --steps >= 2, "
                 "--max-tokens >= 0, --weights f32|bf16\n");
    return 2;
  }

  if (Status s = engine::CheckDevice(eo.device); !s.ok()) {
    std::fprintf(stderr, "bitroll generate: %s\n", s.ToString().c_str());
    return s.code() == ErrorCode::kInvalidArgument ? 2 : 1;
  }
  if (eo.device != "cpu" && weights != "f32") {
    std::fprintf(stderr, "bitroll generate: --weights applies to --device cpu only\n");
    return 2;
  }
  Result<engine::ModelWeights> w = engine::LoadModelWeights(eo.model_path);
  if (!w.ok()) {
    std::fprintf(stderr, "bitroll generate: %s\n", w.status().ToString().c_str());
    return 1;
  }
  engine::CpuEngineParts parts;
  Result<std::unique_ptr<engine::Tokenizer>> tok =
      engine::LoadTokenizerFor(eo.model_path, eo.tokenizer_path, w->config.vocab_size);
  if (!tok.ok()) {
    std::fprintf(stderr, "bitroll generate: %s\n", tok.status().ToString().c_str());
    return 1;
  }
  parts.tokenizer = std::move(tok).value();
  parts.weights = std::make_shared<const engine::ModelWeights>(std::move(w).value());
  parts.options = eo;
  parts.weight_storage = weights == "bf16" ? kernels::DType::kBF16 : kernels::DType::kF32;
  const auto t_load = std::chrono::steady_clock::now();
  Result<std::unique_ptr<engine::ForwardBackend>> backend =
      engine::MakeDeviceBackend(eo, parts.weights);
  if (!backend.ok()) {
    std::fprintf(stderr, "bitroll generate: %s\n", backend.status().ToString().c_str());
    return 1;
  }
  parts.backend = std::move(backend).value();
  Result<std::unique_ptr<engine::CpuEngine>> made = engine::CpuEngine::Create(std::move(parts));
  if (!made.ok()) {
    std::fprintf(stderr, "bitroll generate: %s\n", made.status().ToString().c_str());
    return 1;
  }
  engine::CpuEngine& e = **made;
  const engine::Tokenizer* tk = e.tokenizer();

  std::vector<Prompt> prompts;
  if (!prompts_file.empty()) {
    if (Status s = ReadPrompts(prompts_file, tk, &prompts); !s.ok()) {
      std::fprintf(stderr, "bitroll generate: %s\n", s.ToString().c_str());
      return 1;
    }
  } else {
    prompts.push_back({prompt_text, {}});
  }
  for (Prompt& p : prompts) {
    if (!p.ids.empty()) continue;
    if (tk == nullptr) {
      std::fprintf(stderr, "bitroll generate: no tokenizer found beside %s; pass --tokenizer\n",
                   eo.model_path.c_str());
      return 1;
    }
    Result<std::vector<int32_t>> ids = tk->Encode(p.text, /*add_bos=*/true);
    if (!ids.ok()) {
      std::fprintf(stderr, "bitroll generate: %s\n", ids.status().ToString().c_str());
      return 1;
    }
    p.ids = std::move(ids).value();
  }

  // Every prompt x sample goes into the engine at once; continuous batching does the rest.
  for (size_t i = 0; i < prompts.size(); ++i) {
    for (int j = 0; j < n; ++j) {
      engine::SequenceRequest r;
      r.id = i * static_cast<uint64_t>(n) + j;
      r.group_id = i;
      r.prompt = prompts[i].ids;
      r.sample_index = static_cast<uint32_t>(j);
      r.sampling = sp;
      const int fill = steps - static_cast<int>(r.prompt.size()) + 1;  // run.c: pos < steps
      r.stop.max_tokens = max_tokens_flag > 0 ? max_tokens_flag : std::max(1, fill);
      if (Status s = e.Add(std::move(r)); !s.ok()) {
        std::fprintf(stderr, "bitroll generate: prompt %zu: %s\n", i, s.ToString().c_str());
        return 1;
      }
    }
  }
  std::vector<engine::SequenceOutput> done;
  int64_t generated = 0;
  const auto t0 = std::chrono::steady_clock::now();
  while (e.HasWork()) {
    Result<engine::StepResult> step = e.Step();
    if (!step.ok()) {
      std::fprintf(stderr, "bitroll generate: %s\n", step.status().ToString().c_str());
      return 1;
    }
    generated += static_cast<int64_t>(step->tokens.size());
    for (auto& f : step->finished) done.push_back(std::move(f));
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::sort(done.begin(), done.end(), [](const auto& a, const auto& b) { return a.id < b.id; });

  const engine::ModelInfo& info = e.info();
  for (const engine::SequenceOutput& o : done) {
    const Prompt& p = prompts[o.id / n];
    std::string text;
    if (tk != nullptr) {
      int32_t prev = p.ids.front();
      std::vector<int32_t> all(p.ids.begin() + 1, p.ids.end());
      all.insert(all.end(), o.tokens.begin(), o.tokens.end());
      for (size_t k = 0; k < all.size(); ++k) {
        if (k >= p.ids.size() - 1 && all[k] == info.bos_id) break;  // run.c stops before BOS
        Result<std::string> piece = tk->DecodePiece(prev, all[k]);
        if (piece.ok()) text += engine::PrintablePiece(*piece);
        prev = all[k];
      }
    }
    if (json) {
      nlohmann::json j;
      j["prompt_index"] = o.id / n;
      j["sample_index"] = o.id % n;
      j["prompt_ids"] = p.ids;
      j["ids"] = o.tokens;
      j["logprobs"] = o.logprobs;
      std::vector<std::string> bits;
      for (float lp : o.logprobs) bits.push_back(Hex32(lp));
      j["logprob_bits"] = bits;
      j["finish"] = engine::FinishReasonName(o.finish);
      if (tk != nullptr) j["text"] = text;
      j["cost"] = {{"prefill_tokens_computed", o.cost.prefill_tokens_computed},
                   {"prefill_tokens_cached", o.cost.prefill_tokens_cached},
                   {"decode_tokens", o.cost.decode_tokens},
                   {"engine_seconds", o.cost.engine_seconds}};
      char hash[24];
      std::snprintf(hash, sizeof(hash), "%016" PRIx64, info.fingerprint.weights_hash);
      j["fingerprint"] = {{"weights_hash", hash},
                          {"kernel_version", info.fingerprint.kernel_version},
                          {"attention_chunk", info.fingerprint.attention_chunk},
                          {"backend", info.fingerprint.backend}};
      std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    } else {
      if (done.size() > 1)
        std::cout << "--- prompt " << o.id / n << " sample " << o.id % n << " ---\n";
      std::cout << text << "\n";
    }
  }
  std::cout.flush();
  const double load_s = std::chrono::duration<double>(t0 - t_load).count();
  std::fprintf(stderr,
               "bitroll generate: %zu trajectories, %" PRId64
               " tokens in %.3f s: %.1f tok/s "
               "(device %s, threads %d, isa %s, weights %s); engine setup %.3f s; peak RSS "
               "%.1f MiB\n",
               done.size(), generated, secs, secs > 0 ? generated / secs : 0.0, eo.device.c_str(),
               eo.threads, eo.isa.c_str(), weights.c_str(), load_s, PeakRssKb() / 1024.0);
  return 0;
}

}  // namespace bitroll::rollout
