// rollout/audit_weights.cc: records to model files through the weights registry
// (rollout/audit_weights.h).
#include "rollout/audit_weights.h"

#include <map>
#include <set>

#include "rollout/trajectory_record.h"

namespace bitroll::rollout {

namespace {

struct Resolved {
  std::string file;  // empty: unavailable
  std::string why;   // when unavailable: "version V ..."
};

}  // namespace

WeightsPlan PlanAuditWeights(const std::vector<AuditItem>& items,
                             const std::vector<WeightsEntry>* registry, const std::string& model,
                             const WeightsHasher& hash_of) {
  WeightsPlan plan;
  plan.file_of_item.assign(items.size(), -1);
  plan.verdicts.resize(items.size());
  std::map<std::string, int> index;
  auto use = [&](const std::string& f) {
    auto [it, fresh] = index.emplace(f, static_cast<int>(plan.files.size()));
    if (fresh) plan.files.push_back(f);
    return it->second;
  };
  std::map<std::string, Result<uint64_t>> hashes;
  auto hash = [&](const std::string& f) -> const Result<uint64_t>& {
    auto it = hashes.find(f);
    if (it == hashes.end()) it = hashes.emplace(f, hash_of(f)).first;
    return it->second;
  };
  // --model, when it hashes to `want`.
  auto model_if = [&](uint64_t want) -> std::optional<std::string> {
    if (model.empty()) return std::nullopt;
    const Result<uint64_t>& h = hash(model);
    if (h.ok() && *h == want) return model;
    return std::nullopt;
  };
  auto resolve = [&](uint64_t version, std::optional<uint64_t> record_hash) -> Resolved {
    const std::string v = "version " + std::to_string(version);
    std::optional<WeightsEntry> e = FindWeightsVersion(*registry, version, record_hash);
    if (!e) {
      if (record_hash && !model.empty()) return {model, ""};  // AuditRecords checks its hash
      if (auto m = model_if(record_hash.value_or(0))) return {*m, ""};
      return {"", v + " is not in the weights registry (give --model with its file)"};
    }
    const std::string h = Hex64(e->weights_hash);
    if (e->path.empty()) {
      if (auto m = model_if(e->weights_hash)) return {*m, ""};
      return {"", v + " came as " + (e->source.empty() ? "tensors" : e->source) + " (hash " + h +
                      "): no file holds it" +
                      (model.empty() ? " (give --model with a file of those weights)"
                                     : "; --model " + model + " is other weights")};
    }
    const Result<uint64_t>& now = hash(e->path);
    if (!now.ok()) {
      return {"", v + " was " + e->path + " (hash " + h +
                      "), file now cannot be read: " + now.status().message()};
    }
    if (e->weights_hash != 0 && *now != e->weights_hash) {
      return {"", v + " was " + e->path + " (hash " + h + "), file now hashes " + Hex64(*now)};
    }
    return {e->path, ""};
  };
  for (size_t i = 0; i < items.size(); ++i) {
    const AuditItem& it = items[i];
    if (!it.parse_error.ok() || registry == nullptr) {
      if (!model.empty()) plan.file_of_item[i] = use(model);
      continue;
    }
    const TrajectoryRecord& r = it.record;
    std::vector<uint64_t> versions;  // in span order, distinct
    std::set<uint64_t> seen;
    for (const RecordVersionSpan& s : r.weight_versions) {
      if (seen.insert(s.version).second) versions.push_back(s.version);
    }
    std::vector<Resolved> res;
    bool all = true;
    for (size_t k = 0; k < versions.size(); ++k) {
      res.push_back(resolve(versions[k], k == 0
                                             ? std::optional<uint64_t>(r.fingerprint.weights_hash)
                                             : std::nullopt));
      all = all && !res.back().file.empty();
    }
    AuditVerdict v;
    v.index = i;
    v.group_id = r.group_id;
    v.prompt_index = r.prompt_index;
    v.sample_index = r.sample_index;
    v.kind = VerdictKind::kWeightsUnavailable;
    if (versions.size() == 1 && all) {
      plan.file_of_item[i] = use(res[0].file);
      continue;
    }
    if (versions.size() <= 1) {
      v.detail = "weights unavailable: " + (res.empty() ? "no weight version" : res[0].why);
    } else {
      v.detail = "weights unavailable: multi-version record needs";
      for (size_t k = 0; k < versions.size(); ++k) {
        int32_t begin = 0;
        for (const RecordVersionSpan& s : r.weight_versions) {
          if (s.version == versions[k]) {
            begin = s.begin;
            break;
          }
        }
        v.detail += (k ? "; " : " ") + std::string("from token ") + std::to_string(begin) + " " +
                    (res[k].file.empty() ? res[k].why
                                         : "version " + std::to_string(versions[k]) + " = " +
                                               res[k].file + " (available)");
      }
      v.detail += all ? "; every file is available, but an audit re-scores a trajectory under one "
                        "set of weights (switching weights mid-trajectory is not supported yet)"
                      : "";
    }
    plan.verdicts[i] = std::move(v);
  }
  return plan;
}

}  // namespace bitroll::rollout
