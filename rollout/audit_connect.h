// rollout/audit_connect.h: `bitroll audit --connect ENDPOINT` (docs/audit.md).
//
// An auditor cannot read a running service's records over the protocol (a trajectory goes to the
// client that submitted it, and the WAL belongs to the service), so --connect checks records
// against what the service says it serves: its StatusReply's numerics fingerprint and live
// weight version and hash. A record whose kernel version, attention chunk or backend differs is
// kFingerprintMismatch ("... the service at E runs ..."): that service cannot have made it. A
// record of the live weight version whose weights hash is not the live weights' is
// kWeightsUnavailable ("... the service at E serves version V with weights H"). Records of
// other versions are left to the audit (the weights registry or --model).
//
// Thread-safety: plain functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "rollout/audit.h"
#include "schema/status.h"

namespace bitroll::rollout {

struct ServiceIdentity {
  std::string endpoint;
  uint64_t weight_version = 0;
  NumericsFingerprint fingerprint;  // weights_hash: the live weights'
};

// Asks the service at `endpoint` (GetStatus). Errors: the client's (kTimeout, kProtocol, ...),
// kUnavailable when no replica has joined yet (no fingerprint) or the service predates the
// fingerprint in StatusReply.
Result<ServiceIdentity> QueryServiceIdentity(const std::string& endpoint, int timeout_ms);

// The verdict of one parsed record against the service, or nullopt when it may be audited.
std::optional<AuditVerdict> CheckAgainstService(const AuditItem& item, size_t index,
                                                const ServiceIdentity& s);

}  // namespace bitroll::rollout
