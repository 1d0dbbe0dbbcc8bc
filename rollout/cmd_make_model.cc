// bitroll make-model: writes a reproducible random-weight llama2.c checkpoint and a matching
// tokenizer, for benchmarks and for machines without a trained model.
//
//   bitroll make-model --shape stories110m --out DIR [--seed 1]
#include <cstdio>
#include <filesystem>
#include <string>

#include "engine/make_model.h"
#include "rollout/cli_args.h"
#include "rollout/commands.h"

namespace bitroll::rollout {

int CmdMakeModel(int argc, char** argv) {
  CliArgs args(argc, argv, 1);
  const std::string shape_name = args.String("shape", "stories110m");
  const std::string out = args.String("out", "");
  const uint64_t seed = static_cast<uint64_t>(args.Int("seed", 1));
  const bool help = args.Bool("help");
  if (help || out.empty()) {
    std::fprintf(help ? stdout : stderr,
                 "usage: bitroll make-model --shape NAME --out DIR [--seed S]\n"
                 "  shapes: stories110m, stories110m-gqa, stories15m, stories260k, tiny\n"
                 "  writes DIR/model.bin (llama2.c format) and DIR/tokenizer.bin; random weights:\n"
                 "  the text it generates is gibberish.\n");
    return help ? 0 : 2;
  }
  if (Status s = args.Finish(); !s.ok()) {
    std::fprintf(stderr, "bitroll make-model: %s\n", s.ToString().c_str());
    return 2;
  }
  Result<engine::ModelShape> shape = engine::NamedShape(shape_name);
  if (!shape.ok()) {
    std::fprintf(stderr, "bitroll make-model: %s\n", shape.status().ToString().c_str());
    return 2;
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
