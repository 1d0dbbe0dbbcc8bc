// The coordinator's multi-turn tool loop (docs/protocol.md "Tools"; coordinator_state.h).
//
// A turn that a replica ends with finish == ToolCall is not delivered: its tokens join the
// work's context, the call is logged (WAL ToolCall) and handed to the tool runner, and the loop
// goes on. The result comes back through ToolRunner's eventfd (OnToolsDone), is logged (WAL
// ToolResult), formatted, and the next turn is queued with context_ids + inject_text. The
// replica reports the injected ids first (OnInjected: WAL TurnBoundary), then the turn's tokens.
#include "rollout/coordinator_state.h"

namespace bitroll::rollout {

namespace {

// The replica's spans begin at trajectory indexes, like the context's.
void AppendVersions(std::vector<wire::VersionSpan>* out, const wire::Trajectory& t) {
  if (t.versions() == nullptr) return;
  for (const wire::VersionSpan* v : *t.versions()) {
    if (!out->empty() && out->back().version() == v->version()) continue;
    out->push_back(*v);
  }
}

}  // namespace

bool Coordinator::State::ContinueToolLoop(Work* w, const wire::Trajectory& t) {
  if (t.finish() != wire::FinishReason_ToolCall) return false;
  const wire::SubmitRollouts& m = *w->group->submit;
  const uint32_t n = t.ids() ? t.ids()->size() : 0;
  if (t.logprobs() == nullptr || t.logprobs()->size() != n) return false;
  // No further turn: the call stays unanswered and the trajectory ends with finish ToolCall.
  if (w->turn >= m.max_turns() ||
      w->SampledInContext() + n >= static_cast<uint32_t>(m.max_tokens())) {
    return false;
  }
  const Cost tc = CostFromWire(t.cost());
  w->cost.Add(tc);
  const auto now = Clock::now();
  rate.Add(tc.decode_tokens, now);
  total_cached += tc.prefill_cached;
  total_computed += tc.prefill_computed;
  journal->OnTurnEnded(w, t);  // the turn's tokens not logged yet
  AppendVersions(&w->ctx_versions, t);
  w->ctx_ids.insert(w->ctx_ids.end(), t.ids()->begin(), t.ids()->end());
  w->ctx_lps.insert(w->ctx_lps.end(), t.logprobs()->begin(), t.logprobs()->end());
  w->ctx_mask.resize(w->ctx_mask.size() + n, 1);
  ++w->turn;
  const ResolvedCall rc = ResolveCall(m, t.tool_call() ? t.tool_call()->string_view() : "");
  ToolOutcome o;
  o.name = rc.name;
  o.input = rc.input;
  o.tier = rc.spec ? TierFromWire(rc.spec->tier()) : ToolTier::kFunction;
  o.token_index = static_cast<int32_t>(w->ctx_ids.size());
  const auto index = static_cast<uint32_t>(w->calls.size());
  journal->OnToolCallStarted(*w, o, index);
  w->calls.push_back(std::move(o));
  StartCall(w, index);
  return true;
}

void Coordinator::State::StartCall(Work* w, uint32_t index) {
  const wire::SubmitRollouts& m = *w->group->submit;
  ToolOutcome& o = w->calls[index];
  const wire::ToolSpec* spec = nullptr;
  if (m.tools()) {
    for (const wire::ToolSpec* s : *m.tools()) {
      if (s->name()->string_view() == o.name) spec = s;
    }
  }
  Status err;
  sandbox::Request req;
  if (spec == nullptr) {
    std::string names;
    if (m.tools()) {
      for (const wire::ToolSpec* s : *m.tools())
        names += (names.empty() ? "" : ", ") + s->name()->str();
    }
    err = Status::NotFound("unknown tool '" + o.name.substr(0, 64) + "' (tools: " + names + ")");
  } else if (tools == nullptr) {
    err = Status::Unavailable("this coordinator has no tool runner");
  } else {
    Result<sandbox::Request> r = BuildToolRequest(
        *spec, o.input, {w->group->group_id, w->prompt_index, w->sample_index, index});
    if (r.ok()) {
      req = std::move(r).value();
    } else {
      err = r.status();
    }
  }
  if (!err.ok()) {
    o.error = err;
    return FinishCall(w, index, nullptr);
  }
  w->tool_running = true;
  tools->Submit({w->id, index, std::move(req)});
}

void Coordinator::State::FinishCall(Work* w, uint32_t index, const sandbox::RunResult* run) {
  ToolOutcome& o = w->calls[index];
  if (run != nullptr) FillOutcome(*run, &o);
  w->cost.sandbox_seconds += o.wall_seconds;
  w->cost.sandbox_cpu_seconds += o.cpu_seconds;
  journal->OnToolCallFinished(*w, o, index);
  w->inject = FormatResult(*w->group->submit, o);
  w->tool_running = false;
  w->enqueued = Clock::now();
  Enqueue(w);
}

void Coordinator::State::OnToolsDone() {
  if (tools == nullptr) return;
  for (ToolDone& d : tools->TakeDone()) {
    if (options.metrics) options.metrics->SandboxCall(d.result);
    Work* w = table.FindWork(d.work_id);
    if (w == nullptr || !w->tool_running || d.call_index + 1 != w->calls.size()) {
      continue;  // aborted meanwhile
    }
    FinishCall(w, d.call_index, &d.result);
  }
}

void Coordinator::State::OnInjected(Work* w, const flatbuffers::Vector<int32_t>& ids) {
  if (w->inject.empty()) return;
  journal->OnTurnBoundary(*w, ids);
  ++w->boundaries;
  w->ctx_ids.insert(w->ctx_ids.end(), ids.begin(), ids.end());
  w->ctx_lps.resize(w->ctx_lps.size() + ids.size(), 0.0f);
  w->ctx_mask.resize(w->ctx_mask.size() + ids.size(), 0);
  w->inject.clear();
}

}  // namespace bitroll::rollout
