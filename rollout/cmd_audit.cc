// bitroll audit: reproducibility audits of recorded trajectories (docs/audit.md).
//
//   bitroll audit export --data-dir DIR > records.jsonl
//   bitroll audit FILE.jsonl --model M [--mode rescore|rerun] [--json]
//   bitroll audit --data-dir DIR --model M [--mode rescore|rerun] [--json]
//   bitroll audit FILE.jsonl --weights-registry DIR/weights.jsonl [--connect tcp://HOST:PORT]
//
// With a weights registry (--weights-registry, or weights.jsonl in --data-dir) each record is
// audited with its weight version's file (rollout/audit_weights.h); --connect first checks the
// records against a running service (rollout/audit_connect.h).
//
// Exit status: 0 every trajectory identical, 1 a divergence, 2 something could not be audited
// (or a usage error).
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/cpu_engine.h"
#include "engine/engine.h"
#include "engine/model_loader.h"
#include "engine/tokenizer.h"
#include "rollout/audit.h"
#include "rollout/audit_connect.h"
#include "rollout/audit_trace.h"
#include "rollout/audit_weights.h"
#include "rollout/cli_args.h"
#include "rollout/commands.h"
#include "rollout/engine_flags.h"
#include "rollout/progress.h"
#include "rollout/trajectory_record.h"
#include "rollout/weights_registry.h"
#include "wal/wal.h"

namespace bitroll::rollout {

namespace {

// Every trajectory the WAL in `dir` holds (unfinished, finished, acknowledged but retained), in id
// order; a trajectory that does not convert becomes an item with its error. The WAL is opened
// without committing anything: nothing in the directory changes.
Result<std::vector<AuditItem>> ReadWalItems(const std::string& dir) {
  wal::WalOptions o;
  o.dir = dir;
  o.durability = wal::Durability::kNone;
  o.background_commit = false;
  o.ack_retention_ms = std::numeric_limits<int64_t>::max() / 4;  // keep acknowledged ones
  Result<std::unique_ptr<wal::Wal>> w = wal::Wal::Open(o);
  if (!w.ok()) return w.status().WithContext("data directory " + dir);
  Result<wal::RecoveryResult> rec = (*w)->Recover();
  if (!rec.ok()) return rec.status().WithContext("data directory " + dir);
  std::vector<std::pair<uint64_t, AuditItem>> all;
  auto add = [&](const wal::TrajectoryLog& log) {
    AuditItem it;
    Result<TrajectoryRecord> r = RecordFromWal(log);
    if (r.ok()) {
      it.record = std::move(r).value();
    } else {
      it.parse_error = r.status();
    }
    all.emplace_back(log.id, std::move(it));
  };
  for (const wal::TrajectoryLog& l : rec->unfinished) add(l);
  for (const wal::TrajectoryLog& l : rec->finished) add(l);
  for (uint64_t id : rec->retained) {
    Result<wal::TrajectoryLog> l = (*w)->ReadTrajectory(id);
    if (l.ok()) {
      add(*l);
    } else {
      AuditItem it;
      it.parse_error = l.status();
      all.emplace_back(id, std::move(it));
    }
  }
  for (const wal::QuarantinedTrajectory& q : rec->quarantined) {
    AuditItem it;
    it.parse_error = q.error;
    all.emplace_back(q.id, std::move(it));
  }
  std::stable_sort(all.begin(), all.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<AuditItem> out;
  out.reserve(all.size());
  for (auto& [id, it] : all) out.push_back(std::move(it));
  return out;
}

// One item per non-blank line of a JSON Lines file.
Result<std::vector<AuditItem>> ReadFileItems(const std::string& path) {
  std::ifstream f(path);
  if (!f) return Status::NotFound("records file " + path + " cannot be opened");
  std::vector<AuditItem> out;
  std::string line;
  int lineno = 0;
  while (std::getline(f, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    AuditItem it;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) {
      it.parse_error =
          Status::InvalidArgument("bad record: line " + std::to_string(lineno) + " is not JSON");
    } else {
      Result<TrajectoryRecord> r = RecordFromJson(j);
      if (r.ok()) {
        it.record = std::move(r).value();
      } else {
        it.parse_error = r.status();
      }
    }
    out.push_back(std::move(it));
  }
  return out;
}

int CmdAuditExport(int argc, char** argv) {
  std::string dir;
  CliParser p("audit export",
              "bitroll audit export: print every trajectory logged in a service data directory "
              "(finished or not) as audit records, one JSON object per line (docs/audit.md).");
  p.String("--data-dir", &dir,
           "the service's data directory (its WAL); the service must be stopped", "DIR");
  if (Status s = p.Parse(argc, argv); !s.ok()) return UsageError("audit export", s);
  if (p.help()) return PrintHelp(p);
  if (dir.empty()) {
    return UsageError("audit export", Status::InvalidArgument("--data-dir DIR is required"));
  }
  Result<std::vector<AuditItem>> items = ReadWalItems(dir);
  if (!items.ok()) {
    std::fprintf(stderr, "bitroll audit export: %s\n", items.status().ToString().c_str());
    return 2;
  }
  int bad = 0;
  for (const AuditItem& it : *items) {
    if (!it.parse_error.ok()) {
      std::fprintf(stderr, "bitroll audit export: skipped a trajectory: %s\n",
                   it.parse_error.ToString().c_str());
      ++bad;
      continue;
    }
    std::cout << RecordToJson(it.record).dump(-1, ' ', false,
                                              nlohmann::json::error_handler_t::replace)
              << "\n";
  }
  std::cout.flush();
  std::fprintf(stderr, "bitroll audit export: %zu records from %s%s\n", items->size() - bad,
               dir.c_str(), bad ? " (some skipped)" : "");
  return bad ? 2 : 0;
}

// Divergences whose top-5 alternatives are looked up (each costs one prefill).
constexpr int kMaxExplained = 16;

struct AuditFlags : EngineFlags {
  std::string file, data_dir, mode = "rescore", registry, connect;
  bool json = false;
  int32_t trace_position = -1;
  int64_t record = 0;
  bool tolerance = false;
};

// The engine of the audit: OpenEngine, or a CPU engine with bf16 matmul weights (--weights bf16,
// the "cpu-bf16" fingerprint of `generate --weights bf16`); --kv-dtype travels in f.eo.
Result<std::unique_ptr<engine::Engine>> OpenAuditEngine(const AuditFlags& f) {
  if (f.weights == "f32") return engine::OpenEngine(f.eo);
  BR_ASSIGN_OR_RETURN(std::unique_ptr<engine::CpuEngine> e,
                      OpenCpuEngine(f, /*tokenizer_required=*/false));
  return std::unique_ptr<engine::Engine>(std::move(e));
}

// --trace-layers POS: the per-layer checksums of one record at one position.
int TraceCommand(const AuditFlags& f, const std::vector<AuditItem>& items) {
  if (f.weights != "f32") {
    std::fprintf(stderr, "bitroll audit: --trace-layers traces f32 weights only\n");
    return 2;
  }
  if (f.record < 0 || f.record >= static_cast<int64_t>(items.size())) {
    std::fprintf(stderr, "bitroll audit: --record %" PRId64 ": the input holds %zu records\n",
                 f.record, items.size());
    return 2;
  }
  const AuditItem& it = items[f.record];
  if (!it.parse_error.ok()) {
    std::fprintf(stderr, "bitroll audit: record %" PRId64 ": cannot audit: %s\n", f.record,
                 it.parse_error.message().c_str());
    return 2;
  }
  Result<LayerTrace> t = TraceLayers(f.eo, it.record, f.trace_position);
  if (!t.ok()) {
    std::fprintf(stderr, "bitroll audit: %s\n", t.status().ToString().c_str());
    return 2;
  }
  if (t->weights_hash != it.record.fingerprint.weights_hash) {
    std::fprintf(stderr,
                 "bitroll audit: weights unavailable: record %" PRId64
                 " was made with weights %s, the model given has %s\n",
                 f.record, Hex64(it.record.fingerprint.weights_hash).c_str(),
                 Hex64(t->weights_hash).c_str());
    return 2;
  }
  std::fputs(FormatTrace(*t).c_str(), stdout);
  return 0;
}

// Audits each model file's records on an engine of that file (the plan's grouping), in input
// order; records the plan refused keep its verdict.
Result<std::vector<AuditVerdict>> AuditPlanned(const AuditFlags& f, const AuditOptions& ao,
                                               const std::vector<AuditItem>& items,
                                               const WeightsPlan& plan, AuditStats* stats) {
  std::vector<AuditVerdict> out(items.size());
  ProgressLine progress("bitroll audit", static_cast<int64_t>(items.size()),
                        ProgressUnit{"trajectories", 1});
  int64_t finished = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    if (plan.file_of_item[i] >= 0) continue;
    if (plan.verdicts[i]) {
      out[i] = *plan.verdicts[i];
    } else {  // no file at all: only parse errors and records without any weights get here
      out[i].index = i;
      out[i].kind = VerdictKind::kWeightsUnavailable;
      out[i].detail = "weights unavailable: no model file (give --model)";
      if (!items[i].parse_error.ok()) {
        out[i].kind = VerdictKind::kIncomplete;
        out[i].detail = "cannot audit: " + items[i].parse_error.message();
      }
    }
    ++finished;
  }
  progress.Update(finished);
  for (size_t k = 0; k < plan.files.size(); ++k) {
    std::vector<AuditItem> sub;
    std::vector<size_t> where;
    for (size_t i = 0; i < items.size(); ++i) {
      if (plan.file_of_item[i] != static_cast<int>(k)) continue;
      sub.push_back(items[i]);
      where.push_back(i);
    }
    AuditFlags fk = f;
    fk.eo.model_path = plan.files[k];
    Result<std::unique_ptr<engine::Engine>> e = OpenAuditEngine(fk);
    if (!e.ok()) return e.status().WithContext(plan.files[k]);
    AuditStats s;
    const int64_t base = finished;
    BR_ASSIGN_OR_RETURN(
        std::vector<AuditVerdict> v,
        AuditRecords(**e, sub, ao, &s, [&](int64_t done) { progress.Update(base + done); }));
    finished += static_cast<int64_t>(sub.size());
    for (size_t j = 0; j < v.size(); ++j) {
      v[j].index = where[j];
      out[where[j]] = std::move(v[j]);
    }
    stats->tokens_checked += s.tokens_checked;
    stats->tokens_processed += s.tokens_processed;
    stats->engine_seconds += s.engine_seconds;
  }
  progress.Finish();
  return out;
}

void PrintTable(const std::vector<AuditVerdict>& verdicts) {
  std::printf("%6s %10s %6s %6s %7s  %-20s %s\n", "#", "group", "prompt", "sample", "tokens",
              "verdict", "detail");
  for (const AuditVerdict& v : verdicts) {
    std::printf("%6zu %10" PRIu64 " %6u %6u %7" PRId64 "  %-20s %s\n", v.index, v.group_id,
                v.prompt_index, v.sample_index, v.tokens_checked, VerdictName(v.kind),
                v.detail.c_str());
  }
}

}  // namespace

int CmdAudit(int argc, char** argv) {
  if (argc >= 2 && std::string(argv[1]) == "export") return CmdAuditExport(argc - 1, argv + 1);
  AuditFlags f;
  CliParser p("audit",
              "bitroll audit: recompute recorded trajectories and compare their ids and fp32 "
              "logprob bits token by token (docs/audit.md). `bitroll audit export --data-dir DIR` "
              "prints the records of a service data directory.");
  p.Positional("FILE", &f.file, "audit records, one JSON object per line (generate --json)");
  p.String("--data-dir", &f.data_dir,
           "audit every trajectory logged in this (stopped) service's "
           "data directory instead of a file",
           "DIR");
  p.String("--model", &f.eo.model_path,
           "the weights the records claim (env BITROLL_MODEL is the default)", "PATH");
  p.String("--weights-registry", &f.registry,
           "which file each weight version was (a service's weights.jsonl; found in --data-dir "
           "without this flag): each record is audited with its version's file, refused when "
           "the file changed",
           "FILE");
  p.String("--connect", &f.connect,
           "check the records against a running service first: those of another numerics "
           "fingerprint, or of its live version with other weights, are refused (it cannot "
           "have made them); the rest are audited as usual",
           "tcp://HOST:PORT");
  p.String("--tokenizer", &f.eo.tokenizer_path, "for records whose prompt is text", "PATH");
  p.String("--mode", &f.mode,
           "rescore (default: one teacher-forced prefill per trajectory) or rerun (regenerate "
           "from the recorded seed and sample index)",
           "MODE");
  p.Flag("--json", &f.json, "one JSON object (verdicts and summary) on stdout");
  p.Integer("--trace-layers", &f.trace_position,
            "instead of auditing: per-layer checksums of the forward pass at this absolute "
            "position of one record (diff two machines' traces to find the first layer and op "
            "that differs)",
            "POS");
  p.Integer("--record", &f.record, "the record --trace-layers traces (0-based, default 0)", "K");
  p.Flag("--tolerance", &f.tolerance,
         "records of another numerics fingerprint (GPU, bf16) are recomputed and reported by "
         "value (max |delta logprob|, id agreement), labelled not bitwise, instead of "
         "fingerprint_mismatch");
  AddEngineFlags(&p, &f);
  p.Footer(
      "Exit status: 0 every trajectory identical, 1 a divergence, 2 something could not be "
      "audited.");
  Status s = p.Parse(argc, argv);
  if (s.ok() && p.help()) return PrintHelp(p);
  if (s.ok() && f.file.empty() == f.data_dir.empty()) {
    s = Status::InvalidArgument("give either FILE.jsonl or --data-dir DIR");
  }
  if (f.registry.empty() && !f.data_dir.empty() &&
      std::filesystem::exists(WeightsRegistryPath(f.data_dir))) {
    f.registry = WeightsRegistryPath(f.data_dir);
  }
  if (s.ok() && f.eo.model_path.empty() && f.registry.empty()) {
    s = Status::InvalidArgument(
        "--model is required (or set BITROLL_MODEL), unless a weights registry names the files");
  }
  if (s.ok() && f.mode != "rescore" && f.mode != "rerun") {
    s = Status::InvalidArgument("--mode must be rescore or rerun, got '" + f.mode + "'");
  }
  if (s.ok()) s = CheckEngineFlags(&f);
  if (s.ok() && f.weights != "f32" && f.eo.device != "cpu") {
    s = Status::InvalidArgument("--weights must be f32, or bf16 with --device cpu");
  }
  if (!s.ok()) return UsageError("audit", s);
  AuditOptions ao;
  AuditStats stats_holder;
  ao.mode = f.mode == "rerun" ? AuditMode::kRerun : AuditMode::kRescore;
  ao.tolerance = f.tolerance;

  Result<std::vector<AuditItem>> items =
      f.file.empty() ? ReadWalItems(f.data_dir) : ReadFileItems(f.file);
  if (!items.ok()) {
    std::fprintf(stderr, "bitroll audit: %s\n", items.status().ToString().c_str());
    return 2;
  }
  std::optional<std::vector<WeightsEntry>> registry;
  if (!f.registry.empty()) {
    Result<std::vector<WeightsEntry>> r = ReadWeightsRegistry(f.registry);
    if (!r.ok()) {
      std::fprintf(stderr, "bitroll audit: %s\n", r.status().ToString().c_str());
      return 2;
    }
    registry = std::move(r).value();
  }
  std::optional<ServiceIdentity> service;
  if (!f.connect.empty()) {
    Result<ServiceIdentity> s = QueryServiceIdentity(f.connect, 10000);
    if (!s.ok()) {
      std::fprintf(stderr, "bitroll audit: --connect %s: %s\n", f.connect.c_str(),
                   s.status().ToString().c_str());
      return 2;
    }
    service = *s;
    std::fprintf(stderr,
                 "bitroll audit: the service at %s serves weights version %" PRIu64
                 " (hash %s), kernel %u, chunk %u, backend %s\n",
                 s->endpoint.c_str(), s->weight_version, Hex64(s->fingerprint.weights_hash).c_str(),
                 s->fingerprint.kernel_version, s->fingerprint.attention_chunk,
                 s->fingerprint.backend.c_str());
  }
  WeightsPlan plan = PlanAuditWeights(*items, registry ? &*registry : nullptr, f.eo.model_path,
                                      [](const std::string& path) -> Result<uint64_t> {
                                        BR_ASSIGN_OR_RETURN(engine::ModelWeights w,
                                                            engine::LoadModelWeights(path));
                                        return w.weights_hash;
                                      });
  for (size_t i = 0; service && i < items->size(); ++i) {
    if (std::optional<AuditVerdict> v = CheckAgainstService((*items)[i], i, *service)) {
      plan.verdicts[i] = std::move(v);
      plan.file_of_item[i] = -1;
    }
  }
  if (p.Given("--trace-layers")) {
    if (f.eo.model_path.empty() && f.record >= 0 &&
        f.record < static_cast<int64_t>(items->size()) && plan.file_of_item[f.record] >= 0) {
      f.eo.model_path = plan.files[plan.file_of_item[f.record]];
    }
    if (f.eo.model_path.empty()) {
      std::fprintf(stderr, "bitroll audit: record %" PRId64 ": %s\n", f.record,
                   plan.verdicts[f.record] ? plan.verdicts[f.record]->detail.c_str()
                                           : "no model file (give --model)");
      return 2;
    }
    return TraceCommand(f, *items);
  }
  Result<std::vector<AuditVerdict>> verdicts = AuditPlanned(f, ao, *items, plan, &stats_holder);
  if (!verdicts.ok()) {
    std::fprintf(stderr, "bitroll audit: %s\n", verdicts.status().ToString().c_str());
    return 2;
  }
  AuditStats& stats = stats_holder;
  // The top-5 alternatives at the first divergences: one more prefill each, to that position.
  int explained = 0;
  for (AuditVerdict& v : *verdicts) {
    if (!v.divergence || f.eo.device != "cpu" || f.weights != "f32" || explained >= kMaxExplained) {
      continue;
    }
    ++explained;
    Divergence& d = *v.divergence;
    engine::EngineOptions eo = f.eo;
    if (plan.file_of_item[v.index] >= 0) eo.model_path = plan.files[plan.file_of_item[v.index]];
    Result<std::vector<Alternative>> alt =
        TopAlternatives(eo, (*items)[v.index].record, d.position - 1, 5);
    if (!alt.ok()) continue;
    std::string s = "; top-5 there:";
    for (const Alternative& a : *alt) {
      d.top5.emplace_back(a.id, a.logprob);
      char buf[48];
      std::snprintf(buf, sizeof(buf), " %d (%.4g)", a.id, a.logprob);
      s += buf;
    }
    v.detail += s;
  }
  int counts[7] = {0, 0, 0, 0, 0, 0, 0};
  for (const AuditVerdict& v : *verdicts) ++counts[static_cast<int>(v.kind)];
  const int rc = AuditExitStatus(*verdicts);
  const double tps = stats.engine_seconds > 0 ? stats.tokens_checked / stats.engine_seconds : 0;
  std::string hash;
  for (const std::string& file : plan.files) {
    if (!hash.empty()) hash += ",";
    Result<engine::ModelWeights> w = engine::LoadModelWeights(file);
    hash += w.ok() ? Hex64(w->weights_hash) : "?";
  }
  if (f.json) {
    nlohmann::json j;
    j["mode"] = f.mode;
    j["model_weights_hash"] = hash;
    j["verdicts"] = nlohmann::json::array();
    for (const AuditVerdict& v : *verdicts) j["verdicts"].push_back(VerdictToJson(v));
    nlohmann::json c;
    for (int k = 0; k < 7; ++k) c[VerdictName(static_cast<VerdictKind>(k))] = counts[k];
    j["counts"] = c;
    j["trajectories"] = verdicts->size();
    j["tokens_checked"] = stats.tokens_checked;
    j["engine_seconds"] = stats.engine_seconds;
    j["tokens_per_second"] = tps;
    j["exit_status"] = rc;
    std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  } else {
    PrintTable(*verdicts);
    std::printf(
        "bitroll audit (%s, weights %s): %zu trajectories: %d identical, %d diverged, %d "
        "fingerprint mismatch, %d weights unavailable, %d incomplete, %d errors",
        f.mode.c_str(), hash.c_str(), verdicts->size(), counts[0], counts[1], counts[2], counts[3],
        counts[4], counts[5]);
    if (counts[6] > 0) std::printf(", %d tolerance reports (NOT bitwise)", counts[6]);
    std::printf("\n");
  }
  std::cout.flush();
  std::fprintf(stderr,
               "bitroll audit: %s: %" PRId64
               " tokens checked in %.3f s of engine time: %.1f "
               "tok/s (threads %d, isa %s)\n",
               f.mode.c_str(), stats.tokens_checked, stats.engine_seconds, tps, f.eo.threads,
               f.eo.isa.c_str());
  return rc;
}

}  // namespace bitroll::rollout
