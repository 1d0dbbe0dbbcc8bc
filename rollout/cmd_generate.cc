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
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/cpu_engine.h"
#include "engine/model_loader.h"
#include "engine/sampler.h"
#include "rollout/cli_args.h"
#include "rollout/commands.h"
#include "rollout/engine_flags.h"
#include "rollout/progress.h"
#include "rollout/trajectory_record.h"

namespace bitroll::rollout {

namespace {

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

// The command line of `bitroll generate`, with its defaults.
struct GenerateFlags : EngineFlags {
  int32_t n = 1;
  int32_t steps = 256;
  int32_t max_tokens = 0;
  bool json = false;
  bool routes = false;
  double temperature = 1.0, top_p = 0.9, min_p = 0.0;
  int64_t top_k = 0;
  uint64_t seed = 42;
  std::string prompt = "Once upon a time";
  std::string prompts_file;
};

void AddGenerateFlags(CliParser* p, GenerateFlags* f) {
  p->String("--model", &f->eo.model_path,
            "llama2.c checkpoint (.bin); env BITROLL_MODEL is the default", "PATH");
  p->String("--tokenizer", &f->eo.tokenizer_path,
            "llama2.c tokenizer (default: tokenizer.bin or tok<vocab>.bin beside the model)",
            "PATH");
  p->String("--prompt", &f->prompt, "one prompt (default \"Once upon a time\")", "TEXT");
  p->String("--prompts", &f->prompts_file,
            "JSONL: one prompt per line, \"...\", {\"prompt\": \"...\"} or {\"ids\": [1, 2, ...]}",
            "FILE");
  p->Integer("-n,--n", &f->n, "samples per prompt (default 1); sample i uses noise stream i");
  p->Integer("--max-tokens", &f->max_tokens,
             "tokens to generate per sample (default: fill --steps)");
  p->Integer("--steps", &f->steps,
             "llama2.c run.c's -n: total positions incl. the prompt (default 256)");
  p->Group("Sampling (checked before the model loads)");
  p->Double("--temperature", &f->temperature,
            "0 = greedy, else >= 1e-6 (default 1.0); a positive T below 1e-6 is refused "
            "(logits / T overflows fp32): pass 0 for greedy",
            "T");
  p->Double("--top-p", &f->top_p, "nucleus sampling, in (0, 1] (default 0.9)", "P");
  p->Integer("--top-k", &f->top_k, "keep the K most likely, 0 = off (default 0)", "K");
  p->Double("--min-p", &f->min_p, "in [0, 1], 0 = off (default 0)", "P");
  p->Integer("--seed", &f->seed, "any integer in [0, 2^64 - 1], as the wire seed (default 42)",
             "S");
  AddEngineFlags(p, f);
  p->Group("Output");
  p->Flag("--json", &f->json, "one JSON object per trajectory on stdout");
  p->Flag("--routes", &f->routes,
          "with --json, MoE models: each record carries its routing record (expert ids and fp32 "
          "weights per position and layer, docs/moe.md)");
  p->Footer(
      "Text output follows llama2.c run.c (prompt, then the generated pieces, then a newline).");
}

// The checks that need no model: ranges and the sampling parameters. Errors: kInvalidArgument.
Status CheckGenerateFlags(GenerateFlags* f, SamplingParams* sp) {
  sp->temperature = ToFloat(f->temperature);
  sp->top_p = ToFloat(f->top_p);
  sp->min_p = ToFloat(f->min_p);
  sp->seed = f->seed;
  if (f->top_k < 0 || f->top_k > INT32_MAX) {
    return Status::InvalidArgument("--top-k: top_k must be in [0, 2147483647], got " +
                                   std::to_string(f->top_k));
  }
  sp->top_k = static_cast<int32_t>(f->top_k);
  BR_RETURN_IF_ERROR(ValidateSamplingParams(*sp));
  if (f->eo.model_path.empty()) {
    return Status::InvalidArgument("--model is required (or set BITROLL_MODEL)");
  }
  if (f->n < 1 || f->n > 100000 || f->steps < 2 || f->max_tokens < 0) {
    return Status::InvalidArgument("-n must be in [1, 100000], --steps >= 2, --max-tokens >= 0");
  }
  return CheckEngineFlags(f);
}

// The prompts of --prompts FILE (or the one --prompt), each as token ids.
Status LoadPrompts(const GenerateFlags& f, const engine::Tokenizer* tk,
                   std::vector<Prompt>* prompts) {
  if (!f.prompts_file.empty()) {
    BR_RETURN_IF_ERROR(ReadPrompts(f.prompts_file, tk, prompts));
  } else {
    prompts->push_back({f.prompt, {}});
  }
  for (Prompt& p : *prompts) {
    if (!p.ids.empty()) continue;
    if (tk == nullptr) {
      return Status::NotFound("no tokenizer found beside " + f.eo.model_path +
                              "; pass --tokenizer");
    }
    Result<std::vector<int32_t>> ids = tk->Encode(p.text, /*add_bos=*/true);
    if (!ids.ok()) return ids.status();
    p.ids = std::move(ids).value();
  }
  return Status::Ok();
}

// The engine request of sample j of prompt i.
engine::SequenceRequest MakeRequest(const GenerateFlags& f, const SamplingParams& sp,
                                    const std::vector<Prompt>& prompts, size_t i, int j) {
  engine::SequenceRequest r;
  r.id = i * static_cast<uint64_t>(f.n) + j;
  r.group_id = i;
  r.prompt = prompts[i].ids;
  r.sample_index = static_cast<uint32_t>(j);
  r.sampling = sp;
  const int fill = f.steps - static_cast<int>(r.prompt.size()) + 1;  // run.c: pos < steps
  r.stop.max_tokens = f.max_tokens > 0 ? f.max_tokens : std::max(1, fill);
  r.return_routing = f.routes;
  return r;
}

// Every prompt x sample goes into the engine at once; continuous batching does the rest. Returns
// the finished sequences in id order; *generated counts the tokens; *t0: when the steps began.
Result<std::vector<engine::SequenceOutput>> RunAll(engine::CpuEngine& e, const GenerateFlags& f,
                                                   const SamplingParams& sp,
                                                   const std::vector<Prompt>& prompts,
                                                   int64_t* generated,
                                                   std::chrono::steady_clock::time_point* t0) {
  const int n = f.n;
  for (size_t i = 0; i < prompts.size(); ++i) {
    for (int j = 0; j < n; ++j) {
      engine::SequenceRequest r = MakeRequest(f, sp, prompts, i, j);
      if (Status s = e.Add(std::move(r)); !s.ok()) {
        return s.WithContext("prompt " + std::to_string(i));
      }
    }
  }
  std::vector<engine::SequenceOutput> done;
  *t0 = std::chrono::steady_clock::now();
  // --prompts FILE: a progress line on stderr when it is a terminal (never in pipes or tests).
  std::optional<ProgressLine> progress;
  if (!f.prompts_file.empty()) {
    progress.emplace("bitroll generate", static_cast<int64_t>(prompts.size()) * n,
                     ProgressUnit{"trajectories", 1});
  }
  while (e.HasWork()) {
    Result<engine::StepResult> step = e.Step();
    if (!step.ok()) return step.status();
    *generated += static_cast<int64_t>(step->tokens.size());
    for (auto& out : step->finished) done.push_back(std::move(out));
    if (progress) progress->Update(static_cast<int64_t>(done.size()));
  }
  if (progress) progress->Finish();
  std::sort(done.begin(), done.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
  return done;
}

// The prompt and the generated text as llama2.c's run.c prints them.
std::string RunCText(const engine::Tokenizer& tk, const engine::ModelInfo& info, const Prompt& p,
                     const engine::SequenceOutput& o) {
  std::string text;
  int32_t prev = p.ids.front();
  std::vector<int32_t> all(p.ids.begin() + 1, p.ids.end());
  all.insert(all.end(), o.tokens.begin(), o.tokens.end());
  for (size_t k = 0; k < all.size(); ++k) {
    if (k >= p.ids.size() - 1 && all[k] == info.bos_id) break;  // run.c stops before BOS
    Result<std::string> piece = tk.DecodePiece(prev, all[k]);
    if (piece.ok()) text += engine::PrintablePiece(*piece);
    prev = all[k];
  }
  return text;
}

// One trajectory as generate --json prints it: the audit record (rollout/trajectory_record.h,
// docs/audit.md) plus the text and the cost.
nlohmann::json TrajectoryJson(const engine::ModelInfo& info, const SamplingParams& sp,
                              const engine::SequenceRequest& req, const Prompt& p,
                              const engine::SequenceOutput& o, int n, bool have_text,
                              const std::string& text) {
  TrajectoryRecord r;
  r.bitroll_version = BitrollVersion();
  r.source = "generate";
  r.group_id = o.id / n;
  r.prompt_index = static_cast<uint32_t>(o.id / n);
  r.sample_index = static_cast<uint32_t>(o.id % n);
  r.prompt_ids = p.ids;
  r.ids = o.tokens;
  r.mask.assign(o.tokens.size(), 1);
  for (float lp : o.logprobs) r.logprob_bits.push_back(FloatBits(lp));
  r.turn_begins = {0};
  r.sampling = sp;
  r.max_tokens = req.stop.max_tokens;
  r.stop_ids = req.stop.stop_ids;
  r.stop_at_eos = req.stop.stop_at_eos;
  r.stop_at_bos = req.stop.stop_at_bos;
  for (const auto& v : o.versions) r.weight_versions.push_back({v.begin, v.version});
  r.fingerprint = info.fingerprint;
  r.finish = FinishReasonName(o.finish);
  r.routing = o.routing;
  nlohmann::json j = RecordToJson(r);
  if (have_text) j["text"] = text;
  j["cost"] = {{"prefill_tokens_computed", o.cost.prefill_computed},
               {"prefill_tokens_cached", o.cost.prefill_cached},
               {"decode_tokens", o.cost.decode_tokens},
               {"engine_seconds", o.cost.engine_seconds}};
  return j;
}

void PrintTrajectories(const engine::CpuEngine& e, const GenerateFlags& f, const SamplingParams& sp,
                       const std::vector<Prompt>& prompts,
                       const std::vector<engine::SequenceOutput>& done) {
  const engine::Tokenizer* tk = e.tokenizer();
  const int n = f.n;
  for (const engine::SequenceOutput& o : done) {
    const Prompt& p = prompts[o.id / n];
    const std::string text = tk != nullptr ? RunCText(*tk, e.info(), p, o) : std::string();
    if (f.json) {
      const engine::SequenceRequest req = MakeRequest(f, sp, prompts, o.id / n, o.id % n);
      std::cout << TrajectoryJson(e.info(), sp, req, p, o, n, tk != nullptr, text)
                       .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
                << "\n";
    } else {
      if (done.size() > 1)
        std::cout << "--- prompt " << o.id / n << " sample " << o.id % n << " ---\n";
      std::cout << text << "\n";
    }
  }
  std::cout.flush();
}

int Fail(const Status& s) {
  std::fprintf(stderr, "bitroll generate: %s\n", s.ToString().c_str());
  return 1;
}

}  // namespace

int CmdGenerate(int argc, char** argv) {
  GenerateFlags f;
  CliParser p("generate",
              "bitroll generate: run prompts through the engine on this machine and print the "
              "trajectories (text like llama2.c's run.c, or --json with ids, logprobs and their "
              "exact bits, finish reason, cost and the numerics fingerprint).");
  AddGenerateFlags(&p, &f);
  SamplingParams sp;
  Status s = p.Parse(argc, argv);
  if (s.ok() && p.help()) return PrintHelp(p);
  if (s.ok()) s = CheckGenerateFlags(&f, &sp);
  if (!s.ok()) return UsageError("generate", s);
  if (s = engine::CheckDevice(f.eo.device); !s.ok()) {
    return s.code() == ErrorCode::kInvalidArgument ? UsageError("generate", s) : Fail(s);
  }
  if (f.eo.device != "cpu" && f.weights != "f32") {
    return UsageError("generate",
                      Status::InvalidArgument("--weights applies to --device cpu only"));
  }
  auto t_load = std::chrono::steady_clock::now(), t0 = t_load;
  Result<std::unique_ptr<engine::CpuEngine>> made =
      OpenCpuEngine(f, /*tokenizer_required=*/true, &t_load);
  if (!made.ok()) return Fail(made.status());
  engine::CpuEngine& e = **made;
  std::vector<Prompt> prompts;
  if (s = LoadPrompts(f, e.tokenizer(), &prompts); !s.ok()) return Fail(s);
  int64_t generated = 0;
  Result<std::vector<engine::SequenceOutput>> done = RunAll(e, f, sp, prompts, &generated, &t0);
  if (!done.ok()) return Fail(done.status());
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  PrintTrajectories(e, f, sp, prompts, *done);
  const double load_s = std::chrono::duration<double>(t0 - t_load).count();
  std::fprintf(stderr,
               "bitroll generate: %zu trajectories, %" PRId64
               " tokens in %.3f s: %.1f tok/s "
               "(device %s, threads %d, isa %s, weights %s); engine setup %.3f s; peak RSS "
               "%.1f MiB\n",
               done->size(), generated, secs, secs > 0 ? generated / secs : 0.0,
               f.eo.device.c_str(), f.eo.threads, f.eo.isa.c_str(), f.weights.c_str(), load_s,
               PeakRssKb() / 1024.0);
  return 0;
}

}  // namespace bitroll::rollout
