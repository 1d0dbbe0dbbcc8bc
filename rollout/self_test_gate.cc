#include "rollout/self_test_gate.h"

#include <cstdio>

#include <spdlog/spdlog.h>

namespace bitroll::rollout {

engine::SelfTestVerdict GateOnSelfTest(const std::string& who, const engine::Engine& engine,
                                       const engine::EngineOptions& options, bool skip) {
  engine::SelfTestVerdict v;
  if (skip) {
    v.state = engine::SelfTestVerdict::State::kSkipped;
    v.reason = "--skip-self-test: not run";
    spdlog::warn(
        "{}: --skip-self-test: the start-up invariance self-test was NOT run; this replica's "
        "bitwise reproducibility on this machine is UNCHECKED",
        who);
    return v;
  }
  engine::SelfTestReport report;
  const Status s = engine::RunInvarianceSelfTest(engine, options, {}, &report);
  v = engine::VerdictOf(s, report);
  if (v.ok_to_serve()) {
    spdlog::info("{}: invariance self-test {}", who, report.Summary());
    return v;
  }
  spdlog::error("{}: invariance self-test {}", who, v.reason);
  std::fprintf(stderr,
               "%s: refusing to serve: the invariance self-test failed on this machine\n%s%s%s"
               "(`bitroll self-test --model PATH` prints the report; --skip-self-test serves "
               "anyway, unchecked)\n",
               who.c_str(), report.ran ? report.ToString().c_str() : "",
               report.mismatches.empty() ? s.ToString().c_str() : "",
               report.mismatches.empty() ? "\n" : "");
  return v;
}

}  // namespace bitroll::rollout
