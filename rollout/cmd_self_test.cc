// rollout/cmd_self_test.cc: `bitroll self-test`: the start-up invariance self-test of `serve` and
// `replica` (engine/self_test.h), alone. Prints the report on stdout; exits 0 when it passed, 1
// when it failed (or the model could not be opened), 2 on a usage error.
#include <cstdio>
#include <string>

#include "engine/engine.h"
#include "engine/self_test.h"
#include "rollout/cli_args.h"
#include "rollout/commands.h"

namespace bitroll::rollout {

int CmdSelfTest(int argc, char** argv) {
  engine::EngineOptions o;
  engine::SelfTestOptions st;
  CliParser p("self-test",
              "bitroll self-test: the invariance self-test that `serve` and `replica` run before "
              "serving, alone: batch, chunked prefill, prefill vs decode, every ISA and both "
              "attention kernels, compared bit for bit on the loaded model.");
  p.String("--model", &o.model_path, "model: llama2.c .bin, GGUF or Hugging Face folder", "PATH");
  p.String("--tokenizer", &o.tokenizer_path, "tokenizer (default: beside the model)", "PATH");
  p.String("--device", &o.device, "where the forward pass runs (default cpu)", "cpu|cuda");
  p.Integer("--threads", &o.threads, "kernel threads (default 1)");
  p.String("--isa", &o.isa, "the ISA of the reference engine (default auto)",
           "auto|scalar|avx2|avx512");
  p.Integer("--tokens", &st.generate_tokens,
            "tokens generated per request (default " + std::to_string(st.generate_tokens) + ")");
  Status s = p.Parse(argc, argv);
  if (s.ok() && p.help()) return PrintHelp(p);
  if (s.ok() && o.model_path.empty()) s = Status::InvalidArgument("--model is required");
  if (s.ok() && (st.generate_tokens < 1 || st.generate_tokens > 4096)) {
    s = Status::InvalidArgument("--tokens must be in [1, 4096]");
  }
  if (!s.ok()) return UsageError("self-test", s);
  Result<std::unique_ptr<engine::Engine>> e = engine::OpenEngine(o);
  if (!e.ok()) {
    std::fprintf(stderr, "bitroll self-test: %s\n", e.status().ToString().c_str());
    return 1;
  }
  engine::SelfTestReport report;
  s = engine::RunInvarianceSelfTest(**e, o, st, &report);
  const std::string text = report.ToString();
  std::fwrite(text.data(), 1, text.size(), stdout);
  if (!s.ok()) {
    std::fprintf(stderr, "bitroll self-test: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace bitroll::rollout
