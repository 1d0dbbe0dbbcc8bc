// rollout/main.cc: the `bitroll` executable: subcommand dispatch.
#include <cstdio>
#include <cstring>

#include "rollout/commands.h"
#include "rollout/malloc_tuning.h"

namespace {

void PrintHelp(FILE* out) {
  std::fprintf(
      out,
      "bitroll: bitwise-reproducible rollouts for RL training of language models\n"
      "\n"
      "usage: bitroll <command> [flags]\n"
      "\n"
      "commands:\n"
      "  serve       run the rollout coordinator with in-process replicas\n"
      "              --model PATH --replicas N --bind tcp://127.0.0.1:PORT\n"
      "              [--replica-bind tcp://0.0.0.0:PORT] [--config FILE.json] [--tokenizer PATH]\n"
      "              [--engine auto|null] [--device cpu|cuda] [--threads N] [--max-queued N]\n"
      "              [--replica-timeout-ms N] [--stream-timeout-ms N] [--price-replica-hour USD]\n"
      "              [--weights-load-timeout-ms N] [--log-level L] [--skip-self-test]\n"
      "              write-ahead log: [--data-dir DIR] [--durability sync|window|none]\n"
      "              [--wal-commit-ms N] [--wal-sync-window-ms N] [--retention-max-age-s N]\n"
      "              [--retention-max-groups N]\n"
      "              clients: [--max-client-buffer-bytes N] (a slow reader is dropped past it)\n"
      "              tools: [--tool-workers N] [--tool-max-concurrent N] [--tool-uid-base UID]\n"
      "              [--tool-append-file PATH] [--price-sandbox-cpu-hour USD]\n"
      "              [--tool-work-root DIR] [--tool-disk-bytes N]\n"
      "              metrics: [--metrics-bind HOST:PORT] (Prometheus /metrics and /health)\n"
      "  replica     run one engine replica for a remote coordinator\n"
      "              --connect tcp://HOST:PORT --model PATH [--name S] [--engine auto|null]\n"
      "              [--device cpu|cuda] [--threads N] [--weights-load-timeout-ms N]\n"
      "              [--metrics-bind HOST:PORT] [--skip-self-test]\n"
      "  cost        cost tables from trajectories (JSON Lines)\n"
      "              FILE.jsonl [--format table|csv|json] [--price-replica-hour USD]\n"
      "              [--plot FILE.png] (pictures: scripts/plot_cost.py)\n"
      "  update-weights  give a running service new weights (docs/weights.md)\n"
      "              --connect tcp://HOST:PORT --version V (--path FILE | --stream FILE\n"
      "              [--full]) [--drain] [--part-kib N] [--timeout-ms N]\n"
      "  self-test   the start-up invariance self-test alone, on a model (exit 0 / 1)\n"
      "              --model PATH [--device cpu|cuda] [--threads N] [--isa I]\n"
      "  generate    generate from a prompt locally (no service)\n"
      "  make-model  write a small random model for tests\n"
      "  audit       re-score or re-run recorded trajectories, compare bits (docs/audit.md)\n"
      "              FILE.jsonl|--data-dir DIR --model PATH [--mode rescore|rerun] [--json];\n"
      "              audit export --data-dir DIR prints a data directory's records\n"
      "  --help      this text\n"
      "\n"
      "bitroll <command> --help lists a command's flags. docs/protocol.md describes the wire\n"
      "protocol and the config file.\n");
}

#if !defined(BITROLL_HAVE_CMD_GENERATE) || !defined(BITROLL_HAVE_CMD_MAKE_MODEL)
int NotBuilt(const char* name) {
  std::fprintf(stderr, "bitroll %s: not built in this configuration\n", name);
  return 2;
}
#endif

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") ||
      !std::strcmp(argv[1], "help")) {
    PrintHelp(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const char* cmd = argv[1];
  using namespace bitroll::rollout;
  if (!std::strcmp(cmd, "serve") || !std::strcmp(cmd, "replica")) TuneMallocForService();
  if (!std::strcmp(cmd, "serve")) return CmdServe(argc - 1, argv + 1);
  if (!std::strcmp(cmd, "replica")) return CmdReplica(argc - 1, argv + 1);
  if (!std::strcmp(cmd, "cost")) return CmdCost(argc - 1, argv + 1);
  if (!std::strcmp(cmd, "audit")) return CmdAudit(argc - 1, argv + 1);
  if (!std::strcmp(cmd, "update-weights")) return CmdUpdateWeights(argc - 1, argv + 1);
  if (!std::strcmp(cmd, "self-test")) return CmdSelfTest(argc - 1, argv + 1);
  if (!std::strcmp(cmd, "generate")) {
#ifdef BITROLL_HAVE_CMD_GENERATE
    return CmdGenerate(argc - 1, argv + 1);
#else
    return NotBuilt("generate");
#endif
  }
  if (!std::strcmp(cmd, "make-model")) {
#ifdef BITROLL_HAVE_CMD_MAKE_MODEL
    return CmdMakeModel(argc - 1, argv + 1);
#else
    return NotBuilt("make-model");
#endif
  }
  std::fprintf(stderr, "bitroll: unknown command '%s'\n\n", cmd);
  PrintHelp(stderr);
  return 2;
}
