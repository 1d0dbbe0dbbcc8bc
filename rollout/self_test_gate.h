// rollout/self_test_gate.h: the start-up invariance self-test (engine/self_test.h) as the gate
// before a replica serves. `bitroll serve` runs it on its first in-process engine before the
// coordinator starts, `bitroll replica` before it connects; a failure refuses to serve (the
// caller exits 1, and a remote replica never joins), with the reason logged and printed on
// stderr. The verdict is kept by the coordinator (CoordinatorOptions::self_test,
// Coordinator::self_test()) for Status and a /health reason.
//
// --skip-self-test skips it, logged loudly (spdlog warn): the replica then serves unchecked.
//
// Thread-safety: call from one thread, before the engine serves.
#pragma once

#include <string>

#include "engine/engine.h"
#include "engine/self_test.h"

namespace bitroll::rollout {

// Runs the self-test on `engine` (opened with `options`) unless `skip`, logs the outcome, and on
// failure prints "<who>: refusing to serve: ..." and the report on stderr. The verdict's
// ok_to_serve() says whether the caller may go on.
engine::SelfTestVerdict GateOnSelfTest(const std::string& who, const engine::Engine& engine,
                                       const engine::EngineOptions& options, bool skip);

}  // namespace bitroll::rollout
