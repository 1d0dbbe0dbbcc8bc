// rollout/audit_connect.cc: records checked against a running service (rollout/audit_connect.h).
#include "rollout/audit_connect.h"

#include "rollout/client.h"
#include "rollout/trajectory_record.h"

namespace bitroll::rollout {

Result<ServiceIdentity> QueryServiceIdentity(const std::string& endpoint, int timeout_ms) {
  ClientOptions o;
  o.endpoint = endpoint;
  BR_ASSIGN_OR_RETURN(std::unique_ptr<Client> c, Client::Connect(o));
  BR_ASSIGN_OR_RETURN(StatusInfo st, c->GetStatus(timeout_ms));
  if (!st.fingerprint) {
    return Status::Unavailable("the service at " + endpoint +
                               " reports no numerics fingerprint (no replica joined yet, or it "
                               "predates fingerprints in StatusReply)");
  }
  ServiceIdentity s;
  s.endpoint = endpoint;
  s.weight_version = st.weight_version;
  s.fingerprint = *st.fingerprint;
  return s;
}

std::optional<AuditVerdict> CheckAgainstService(const AuditItem& item, size_t index,
                                                const ServiceIdentity& s) {
  if (!item.parse_error.ok()) return std::nullopt;
  const NumericsFingerprint& r = item.record.fingerprint;
  const NumericsFingerprint& f = s.fingerprint;
  AuditVerdict v;
  v.index = index;
  v.group_id = item.record.group_id;
  v.prompt_index = item.record.prompt_index;
  v.sample_index = item.record.sample_index;
  if (r.kernel_version != f.kernel_version || r.attention_chunk != f.attention_chunk ||
      r.backend != f.backend) {
    v.kind = VerdictKind::kFingerprintMismatch;
    v.detail = "fingerprint mismatch: record (kernel " + std::to_string(r.kernel_version) +
               ", chunk " + std::to_string(r.attention_chunk) + ", backend " + r.backend +
               ") vs the service at " + s.endpoint + " (kernel " +
               std::to_string(f.kernel_version) + ", chunk " + std::to_string(f.attention_chunk) +
               ", backend " + f.backend + "): that service cannot have made it";
    return v;
  }
  const auto& versions = item.record.weight_versions;
  if (!versions.empty() && versions.front().version == s.weight_version &&
      r.weights_hash != f.weights_hash) {
    v.kind = VerdictKind::kWeightsUnavailable;
    v.detail = "weights unavailable: the record says version " + std::to_string(s.weight_version) +
               " had weights " + Hex64(r.weights_hash) + ", the service at " + s.endpoint +
               " serves version " + std::to_string(s.weight_version) + " with weights " +
               Hex64(f.weights_hash);
    return v;
  }
  return std::nullopt;
}

}  // namespace bitroll::rollout
