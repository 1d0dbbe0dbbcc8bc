// bitroll make-model: writes a reproducible random-weight llama2.c checkpoint and a matching
// tokenizer, for benchmarks and for machines without a trained model. The Qwen3 / Llama 3 /
// mixture-of-experts shapes of engine/make_model_hf.h are written as a Hugging Face directory.
//
//   bitroll make-model --shape stories110m --out DIR [--seed 1]
//   bitroll make-model --shape qwen3-moe-tiny --out DIR
#include <cstdio>
#include <filesystem>
#include <string>

#include "engine/make_model.h"
#include "engine/make_model_hf.h"
#include "rollout/cli_args.h"
#include "rollout/commands.h"

namespace bitroll::rollout {

int CmdMakeModel(int argc, char** argv) {
  std::string shape_name = "stories110m", out;
  uint64_t seed = 1;
  CliParser p("make-model",
              "bitroll make-model: write a reproducible random-weight model for tests and "
              "benchmarks.");
  p.String("--shape", &shape_name,
           "stories110m (default), stories110m-gqa, stories15m, stories260k, tiny, ... "
           "(engine/make_model.h); qwen3-tiny, qwen3-gqa4-tiny, llama3-tiny, qwen3-moe-tiny, "
           "qwen2-moe-tiny, "
           "moe-100m, moe-100m-dense, swa-tiny, swa-5to1-tiny, hybrid-bench (Hugging Face folders, "
           "engine/make_model_hf.h)",
           "NAME");
  p.String("--out", &out, "folder for model.bin (llama2.c format) and tokenizer.bin", "DIR");
  p.Integer("--seed", &seed, "weights seed, in [0, 2^64 - 1] (default 1)", "S");
  p.Footer("Random weights: the text the model generates is gibberish.");
  if (Status s = p.Parse(argc, argv); !s.ok()) return UsageError("make-model", s);
  if (p.help()) return PrintHelp(p);
  if (out.empty())
    return UsageError("make-model", Status::InvalidArgument("--out DIR is required"));
  Result<engine::ModelShape> shape = engine::NamedShape(shape_name);
  if (Result<engine::HfModelShape> hf = engine::NamedHfShape(shape_name); !shape.ok() && hf.ok()) {
    if (Status s = engine::WriteRandomHfModel(*hf, seed, out); !s.ok()) {
      std::fprintf(stderr, "bitroll make-model: %s\n", s.ToString().c_str());
      return 1;
    }
    std::fprintf(stderr,
                 "bitroll make-model: wrote config.json, model.safetensors and tokenizer.json in "
                 "%s (shape %s, seed %llu)\n",
                 out.c_str(), shape_name.c_str(), static_cast<unsigned long long>(seed));
    return 0;
  }
  if (!shape.ok()) {
    return UsageError("make-model",
                      Status::NotFound(shape.status().message() + "; Hugging Face shapes: " +
                                       engine::NamedHfShape("").status().message()));
  }
  std::error_code ec;
  std::filesystem::create_directories(out, ec);
  if (ec) {
    std::fprintf(stderr, "bitroll make-model: cannot create %s: %s\n", out.c_str(),
                 ec.message().c_str());
    return 1;
  }
  const std::string model = out + "/model.bin", tok = out + "/tokenizer.bin";
  if (Status s = engine::WriteRandomModel(*shape, seed, model, tok); !s.ok()) {
    std::fprintf(stderr, "bitroll make-model: %s\n", s.ToString().c_str());
    return 1;
  }
  std::fprintf(stderr, "bitroll make-model: wrote %s and %s (shape %s, seed %llu)\n", model.c_str(),
               tok.c_str(), shape_name.c_str(), static_cast<unsigned long long>(seed));
  return 0;
}

}  // namespace bitroll::rollout
