// rollout/replica_weights.h: a replica's side of UpdateWeights (schema/rollout.fbs).
//
// One message at a time, between two engine steps:
//   path            the engine loads the file (Engine::UpdateWeights);
//   tensors, more   a part of a streamed update: its slices are staged (engine/weight_update.h)
//                   over the weights served now; nothing changes for running sequences;
//   more = false    the commit: the last slices are staged, then Engine::InstallWeights;
//   nccl            the tensors arrive by NCCL broadcast (engine/nccl_weights.h), then install.
//   abort           drops what was staged for the version.
// A staged update is keyed by its version: a part of another version drops what was staged (the
// earlier update was abandoned). After a failed part every later part and the commit of that
// version get the same error until an abort, so a broken stream never installs half an update.
//
// Thread-safety: used by the replica thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "engine/engine.h"
#include "schema/status.h"

namespace bitroll::wire {
struct UpdateWeights;
}

namespace bitroll::engine {
class WeightStager;
}

namespace bitroll::rollout {

class ReplicaWeights {
 public:
  // NCCL updates are received on CUDA device 0 of the replica's process (its visible devices).
  ReplicaWeights(engine::Engine& engine, std::string name);
  ~ReplicaWeights();

  // Applies one message. Ok: the live version is version() (unchanged by a part). The error is
  // typed; the engine keeps serving the weights it had.
  Status Apply(const wire::UpdateWeights& u);
  // Installs weights loaded elsewhere (a path update, loaded on the replica's loader thread)
  // under `version`. The error is typed; the engine keeps serving the weights it had.
  Status Install(std::shared_ptr<const engine::ModelWeights> w, uint64_t version);
  uint64_t version() const { return version_; }

 private:
  Status Stage(const wire::UpdateWeights& u);

  engine::Engine& engine_;
  std::string name_;
  uint64_t version_ = 0;
  std::unique_ptr<engine::WeightStager> staging_;
  uint64_t staging_version_ = 0;
  bool staging_failed_ = false;
  Status staging_error_;
};

}  // namespace bitroll::rollout
