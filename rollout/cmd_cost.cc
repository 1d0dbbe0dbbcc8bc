// rollout/cmd_cost.cc: `bitroll cost FILE.jsonl [--format table|csv|json]
//   [--price-replica-hour USD] [--price-sandbox-cpu-hour USD] [--long-context N]`
// FILE is JSON Lines of trajectories (`bitroll generate --json`, or the Python client's
// Trajectory.to_json()); "-" reads stdin.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "rollout/commands.h"
#include "rollout/cost_report.h"

namespace bitroll::rollout {

int CmdCost(int argc, char** argv) {
  std::string file, format = "table";
  CostReportOptions o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--format" && has_value) {
      format = argv[++i];
    } else if (a == "--price-replica-hour" && has_value) {
      o.price.replica_hour_usd = std::atof(argv[++i]);
    } else if (a == "--price-sandbox-cpu-hour" && has_value) {
      o.price.sandbox_cpu_hour_usd = std::atof(argv[++i]);
    } else if (a == "--long-context" && has_value) {
      o.long_context_tokens = std::atoll(argv[++i]);
    } else if (file.empty() && (a == "-" || a[0] != '-')) {
      file = a;
    } else {
      std::fprintf(stderr, "bitroll cost: unknown or incomplete flag %s\n", a.c_str());
      return 2;
    }
  }
  if (file.empty()) {
    std::fprintf(stderr,
                 "usage: bitroll cost FILE.jsonl [--format table|csv|json] "
                 "[--price-replica-hour USD] [--price-sandbox-cpu-hour USD] "
                 "[--long-context N]\n");
    return 2;
  }
  std::stringstream ss;
  if (file == "-") {
    ss << std::cin.rdbuf();
  } else {
    std::ifstream in(file);
    if (!in) {
      std::fprintf(stderr, "bitroll cost: cannot read %s\n", file.c_str());
      return 1;
    }
    ss << in.rdbuf();
  }
  auto rows = ParseCostRows(ss.str(), o);
  if (!rows.ok()) {
    std::fprintf(stderr, "bitroll cost: %s: %s\n", file.c_str(), rows.status().ToString().c_str());
    return 1;
  }
  auto text = RenderCostReport(*rows, format);
  if (!text.ok()) {
    std::fprintf(stderr, "bitroll cost: %s\n", text.status().ToString().c_str());
    return 2;
  }
  std::fwrite(text->data(), 1, text->size(), stdout);
  return 0;
}

}  // namespace bitroll::rollout
