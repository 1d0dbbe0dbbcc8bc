// rollout/cmd_cost.cc: `bitroll cost FILE.jsonl [--format table|csv|json]
//   [--price-replica-hour USD] [--price-sandbox-cpu-hour USD] [--long-context N] [--plot PNG]`
// FILE is JSON Lines of trajectories (`bitroll generate --json`, or the Python client's
// Trajectory.to_json()); "-" reads stdin.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "rollout/cli_args.h"
#include "rollout/commands.h"
#include "rollout/cost_plot.h"
#include "rollout/cost_report.h"

namespace bitroll::rollout {

int CmdCost(int argc, char** argv) {
  std::string file, format = "table", plot;
  CostReportOptions o;
  CliParser p("cost",
              "bitroll cost: cost tables from trajectories (JSON Lines: `bitroll generate --json`, "
              "or the Python client's Trajectory.to_json()).");
  p.Positional("FILE", &file, "FILE.jsonl, or - for stdin");
  p.String("--format", &format, "table, csv or json (default table)", "table|csv|json");
  p.Double("--price-replica-hour", &o.price.replica_hour_usd, "price of one replica hour", "USD");
  p.Double("--price-sandbox-cpu-hour", &o.price.sandbox_cpu_hour_usd,
           "price of one sandbox CPU hour", "USD");
  p.Integer("--long-context", &o.long_context_tokens,
            "prompt + generated tokens from which a trajectory is long-context (default " +
                std::to_string(o.long_context_tokens) + ")");
  p.String("--plot", &plot,
           "draw cost per group and regime, tokens computed vs cached and throughput over time "
           "into FILE.png instead of the table (scripts/plot_cost.py, python3-matplotlib)",
           "FILE.png");
  if (Status s = p.Parse(argc, argv); !s.ok()) return UsageError("cost", s);
  if (p.help()) return PrintHelp(p);
  if (file.empty()) {
    return UsageError("cost", Status::InvalidArgument("FILE.jsonl is required (- reads stdin)"));
  }
  if (!plot.empty()) {
    if (file == "-") {
      return UsageError("cost", Status::InvalidArgument("--plot reads a FILE, not stdin"));
    }
    Result<int> rc = RunCostPlot(file, plot, o);
    if (!rc.ok()) {
      std::fprintf(stderr, "bitroll cost: %s\n", rc.status().ToString().c_str());
      return 1;
    }
    return *rc;
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
  if (!text.ok()) return UsageError("cost", text.status());
  std::fwrite(text->data(), 1, text->size(), stdout);
  return 0;
}

}  // namespace bitroll::rollout
