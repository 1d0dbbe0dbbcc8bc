// rollout/client_audit_record.h: the audit record (docs/audit.md, version 1) of a trajectory a
// Client received (rollout/client.h), for `bitroll audit`.
//
// A trajectory on the wire does not repeat its request, so the caller passes the SubmitRequest it
// came from: the prompt (request.prompts[prompt_index], or text_prompts), sampling parameters,
// seed, stop rules and tool result template are taken from it. The wire does not carry a tool's
// stderr: when a call exited non-zero without a typed error (its injected text quotes stderr),
// the record leaves out tool_result_template, so the audit forces the injected tokens without
// re-deriving them.
//
// Lives in the CLI library beside the record it builds (rollout/trajectory_record.h, which also
// reads WAL records), not in the client library, which links nothing of the WAL.
// Thread-safety: a pure function.
#pragma once

#include "rollout/client.h"
#include "rollout/trajectory_record.h"

namespace bitroll::rollout {

TrajectoryRecord ClientAuditRecord(const TrajectoryResult& t, const SubmitRequest& request);

}  // namespace bitroll::rollout
