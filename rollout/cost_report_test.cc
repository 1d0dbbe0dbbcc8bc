// Tests of rollout/cost_report.{h,cc} (`bitroll cost`).
#include "rollout/cost_report.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace bitroll::rollout {
namespace {

// A `bitroll generate --json` line, a multi-turn client line, a long-context client line.
const char* kInput =
    R"({"prompt_index":0,"sample_index":1,"ids":[5,6,7],"prompt_ids":[1,2],)"
    R"("cost":{"prefill_tokens_computed":2,"prefill_tokens_cached":0,"decode_tokens":3,)"
    R"("engine_seconds":0.5}})"
    "\n"
    R"({"group_id":7,"prompt_index":0,"sample_index":0,"turns":3,"ids":[1],)"
    R"("cost":{"prefill_computed":10,"prefill_cached":20,"decode_tokens":1,)"
    R"("engine_seconds":1.0,"sandbox_cpu_seconds":2.0}})"
    "\n\n"
    R"({"group_id":7,"prompt_index":1,"sample_index":0,"ids":[1,2],)"
    R"("cost":{"prefill_computed":3000,"decode_tokens":2,"engine_seconds":2.0}})"
    "\n";

TEST(CostReportTest, ParsesRegimesAndPrices) {
  CostReportOptions o;
  o.price.replica_hour_usd = 3600.0;      // $1 per engine-second
  o.price.sandbox_cpu_hour_usd = 1800.0;  // $0.5 per sandbox CPU second
  auto rows = ParseCostRows(kInput, o);
  ASSERT_TRUE(rows.ok()) << rows.status().ToString();
  ASSERT_EQ(rows->size(), 3u);
  EXPECT_EQ((*rows)[0].regime, "short_chat");
  EXPECT_EQ((*rows)[0].cost.prefill_computed, 2);
  EXPECT_EQ((*rows)[0].cost.price_usd, 0.5);
  EXPECT_EQ((*rows)[1].regime, "agentic");
  EXPECT_EQ((*rows)[1].cost.price_usd, 2.0);  // 1 engine-s + 2 sandbox CPU-s x $0.5
  EXPECT_EQ((*rows)[2].regime, "long_context");
  EXPECT_EQ((*rows)[2].group_id, 7u);

  auto csv = RenderCostReport(*rows, "csv");
  ASSERT_TRUE(csv.ok());
  EXPECT_NE(csv->find("7,1,0,long_context,1,3000,3000,0,2,2.000000000,0.000000000,"
                      "0.000000000,0,2.000000000\n"),
            std::string::npos)
      << *csv;
  auto js = RenderCostReport(*rows, "json");
  ASSERT_TRUE(js.ok());
  auto j = nlohmann::json::parse(*js);
  EXPECT_EQ(j["trajectories"], 3);
  EXPECT_EQ(j["groups"][1]["group_id"], 7);
  EXPECT_EQ(j["groups"][1]["decode_tokens"], 3);
  EXPECT_EQ(j["groups"][1]["price_usd"], 4.0);
  EXPECT_EQ(j["regimes"]["agentic"]["trajectories"], 1);
  auto table = RenderCostReport(*rows, "table");
  ASSERT_TRUE(table.ok());
  EXPECT_NE(table->find("per regime"), std::string::npos);
}

TEST(CostReportTest, Errors) {
  auto rows = ParseCostRows("{\"cost\":{}}\nnot json\n", {});
  ASSERT_FALSE(rows.ok());
  EXPECT_EQ(rows.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(rows.status().message(), "line 2: not a JSON object");
  EXPECT_EQ(RenderCostReport({}, "xml").status().message(),
            "unknown format 'xml' (table, csv or json)");
}

}  // namespace
}  // namespace bitroll::rollout
