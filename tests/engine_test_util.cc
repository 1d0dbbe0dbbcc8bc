#include "tests/engine_test_util.h"

#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include <unistd.h>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <random>

#include "engine/invariance_checks.h"
#include "engine/loaders/hf.h"
#include "engine/loaders/llama2c.h"
#include "engine/make_model_hf.h"
#include "engine/tokenizers/llama2c_tokenizer.h"

namespace bitroll::testing_util {

std::string ModelsDir() {
  const char* env = std::getenv("BITROLL_MODELS_DIR");
  return env != nullptr && *env != '\0' ? env : BITROLL_MODELS_DIR;
}

std::vector<double> HfReferenceLogprobs(const std::string& dir, const std::vector<int32_t>& tokens,
                                        const std::string& extra) {
  std::string list;
  for (int32_t t : tokens) list += (list.empty() ? "" : ",") + std::to_string(t);
  const std::string cmd = std::string("/usr/bin/python3 ") + BITROLL_SOURCE_DIR +
                          "/tests/hf_reference.py --model " + dir + " --tokens " + list + extra;
  std::string text;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return {};
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) text.append(buf, n);
  if (::pclose(p) != 0) return {};
  std::vector<double> out;
  for (size_t pos = 0; pos < text.size();) {
    const size_t nl = text.find('\n', pos);
    out.push_back(std::strtod(text.substr(pos, nl - pos).c_str(), nullptr));
    pos = nl == std::string::npos ? text.size() : nl + 1;
  }
  return out;
}

std::shared_ptr<const engine::ModelWeights> Stories260K() {
  static std::mutex mu;
  static std::shared_ptr<const engine::ModelWeights> cached;
  std::lock_guard<std::mutex> lock(mu);
  if (cached == nullptr) {
    const std::string path = ModelsDir() + "/stories260K.bin";
    Result<engine::ModelWeights> w = engine::LoadLlama2c(path);
    if (!w.ok()) {
      ADD_FAILURE() << "cannot load the test model " << path << ": " << w.status().ToString()
                    << "\n(stories260K.bin comes from the llama2.c 'tinyllamas' release; set "
                       "BITROLL_MODELS_DIR to its folder)";
      return nullptr;
    }
    cached = std::make_shared<const engine::ModelWeights>(std::move(w).value());
  }
  return cached;
}

std::shared_ptr<const engine::ModelWeights> HfShapeModel(const std::string& name) {
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<const engine::ModelWeights>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(name);
  if (it != cache.end()) return it->second;
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("bitroll_shape_" + std::to_string(::getpid()) + "_" + name);
  Result<engine::HfModelShape> shape = engine::NamedHfShape(name);
  if (!shape.ok()) {
    ADD_FAILURE() << shape.status().ToString();
    return nullptr;
  }
  if (Status s = engine::WriteRandomHfModel(*shape, 7, dir.string()); !s.ok()) {
    ADD_FAILURE() << s.ToString();
    return nullptr;
  }
  Result<engine::ModelWeights> w = engine::LoadHuggingFace(dir.string());
  std::filesystem::remove_all(dir);  // the mapping stays valid
  if (!w.ok()) {
    ADD_FAILURE() << w.status().ToString();
    return nullptr;
  }
  auto p = std::make_shared<const engine::ModelWeights>(std::move(w).value());
  cache[name] = p;
  return p;
}

std::unique_ptr<engine::Tokenizer> Tok512() {
  Result<std::unique_ptr<engine::Tokenizer>> t =
      engine::LoadLlama2cTokenizer(ModelsDir() + "/tok512.bin", 512);
  if (!t.ok()) {
    ADD_FAILURE() << "cannot load tok512.bin: " << t.status().ToString();
    return nullptr;
  }
  return std::move(t).value();
}

std::unique_ptr<engine::CpuEngine> MakeEngine(const EngineSetup& s,
                                              std::shared_ptr<const engine::ModelWeights> w) {
  engine::CpuEngineParts parts;
  parts.weights = w != nullptr ? w : Stories260K();
  if (parts.weights == nullptr) return nullptr;
  parts.options.threads = s.threads;
  parts.options.isa = s.isa;
  parts.options.attention = s.attention;
  parts.options.max_step_tokens = s.max_step_tokens;
  parts.options.max_running = s.max_running;
  parts.options.kv_cache_bytes = s.kv_cache_bytes;
  parts.options.prefix_cache = s.prefix_cache;
  parts.options.max_prefill_chunk = s.max_prefill_chunk;
  parts.options.kv_disk_dir = s.disk_dir;
  parts.options.preempt_every_steps = s.preempt_every_steps;
  parts.options.swa_cache = s.swa_cache;
  parts.matmul_override = s.matmul_override;
  parts.options.kv_dtype = s.kv_dtype;
  Result<std::unique_ptr<engine::CpuEngine>> e = engine::CpuEngine::Create(std::move(parts));
  if (!e.ok()) {
    ADD_FAILURE() << "engine: " << e.status().ToString();
    return nullptr;
  }
  return std::move(e).value();
}

std::map<uint64_t, engine::SequenceOutput> RunAll(
    engine::Engine& e, const std::vector<engine::SequenceRequest>& reqs) {
  std::map<uint64_t, engine::SequenceOutput> out;
  for (const auto& r : reqs) {
    Status s = e.Add(r);
    if (!s.ok()) ADD_FAILURE() << "Add " << r.id << ": " << s.ToString();
  }
  while (e.HasWork()) {
    Result<engine::StepResult> step = e.Step();
    if (!step.ok()) {
      ADD_FAILURE() << "Step: " << step.status().ToString();
      break;
    }
    for (auto& f : step->finished) out[f.id] = std::move(f);
  }
  return out;
}

bool SameTrajectory(const engine::SequenceOutput& a, const engine::SequenceOutput& b) {
  engine::InvarianceMismatch m;
  return !engine::FirstDifference(a, b, &m);
}

SamplingParams Greedy() {
  SamplingParams p;
  p.temperature = 0.0f;
  return p;
}

SamplingParams Sampled() {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_p = 0.9f;
  p.seed = 1234;
  return p;
}

engine::SequenceRequest Target(uint64_t id, const SamplingParams& sp) {
  engine::SequenceRequest r;
  r.id = id;
  r.prompt = {1, 403, 407, 261, 378};  // "Once upon a time"
  r.sampling = sp;
  r.sample_index = 3;
  r.stop.max_tokens = 48;
  r.stop.stop_at_eos = false;
  r.stop.stop_at_bos = false;
  return r;
}

bool ReadGoldenIds(const std::string& path, std::vector<int32_t>* prompt,
                   std::vector<int32_t>* seq) {
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line)) {
    std::istringstream in(line.substr(line.find(':') + 1));
    std::vector<int32_t>* dst = line.rfind("PROMPT_TOKENS", 0) == 0 ? prompt
                                : line.rfind("SEQ", 0) == 0         ? seq
                                                                    : nullptr;
    if (dst == nullptr) continue;
    for (int32_t x; in >> x;) dst->push_back(x);
  }
  return !prompt->empty() && !seq->empty();
}

engine::SequenceRequest RunCRequest(uint64_t id, const std::vector<int32_t>& prompt,
                                    int32_t steps) {
  engine::SequenceRequest r;
  r.id = id;
  r.prompt = prompt;
  r.sampling.temperature = 0.0f;
  r.stop.max_tokens = steps - static_cast<int32_t>(prompt.size()) + 1;  // run.c: pos < steps
  r.stop.stop_at_eos = false;                                           // run.c stops only on BOS
  r.stop.stop_at_bos = true;
  return r;
}

std::vector<int32_t> RunCSequence(const std::vector<int32_t>& prompt,
                                  const std::vector<int32_t>& generated) {
  std::vector<int32_t> seq(prompt.begin() + (prompt.empty() ? 0 : 1), prompt.end());
  seq.insert(seq.end(), generated.begin(), generated.end());
  return seq;
}

}  // namespace bitroll::testing_util
