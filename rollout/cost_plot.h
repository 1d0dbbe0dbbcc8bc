// rollout/cost_plot.h: `bitroll cost FILE --plot OUT.png` runs scripts/plot_cost.py (Debian's
// python3-matplotlib) on the same records and prices.
//
// The script is found at $BITROLL_PLOT_SCRIPT, else beside the executable: <exe>/../../scripts/
// (a build folder inside the checkout, e.g. build/rollout/bitroll) or <exe>/../share/bitroll/.
#pragma once

#include <string>

#include "rollout/cost_report.h"
#include "schema/status.h"

namespace bitroll::rollout {

// The script's path. Errors: kNotFound naming the places looked at.
Result<std::string> FindPlotScript();

// Runs python3 SCRIPT RECORDS --out PNG --bitroll <this executable> with o's prices and
// long-context threshold, and waits. Returns the script's exit status (its messages go to this
// process's stdout and stderr). Errors: kNotFound (no script), kInternal (cannot start it).
Result<int> RunCostPlot(const std::string& records, const std::string& png,
                        const CostReportOptions& o);

}  // namespace bitroll::rollout
