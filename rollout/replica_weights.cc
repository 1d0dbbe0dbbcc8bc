#include "rollout/replica_weights.h"

#include <cstring>
#include <span>

#include <spdlog/spdlog.h>

#include "engine/nccl_weights.h"
#include "engine/weight_update.h"
#include "schema/rollout_generated.h"

namespace bitroll::rollout {

namespace {

std::vector<int64_t> ShapeOf(const wire::TensorFrame& f) {
  std::vector<int64_t> s;
  if (f.shape() != nullptr) s.assign(f.shape()->begin(), f.shape()->end());
  return s;
}

Result<engine::NcclWeightSource> NcclSourceOf(const wire::NcclWeights& n) {
  engine::NcclWeightSource src;
  if (n.unique_id() == nullptr || n.unique_id()->size() != src.unique_id.size()) {
    return Status::InvalidArgument("nccl update: unique_id must have 128 bytes");
  }
  std::memcpy(src.unique_id.data(), n.unique_id()->data(), src.unique_id.size());
  src.world_size = n.world_size();
  src.rank = n.rank();
  if (n.tensors() != nullptr) {
    for (const wire::TensorFrame* f : *n.tensors()) {
      engine::NcclTensorSpec t;
      t.name = f->name() ? f->name()->str() : "";
      BR_ASSIGN_OR_RETURN(t.dtype, ParseDType(f->dtype() ? f->dtype()->string_view() : ""));
      t.shape = ShapeOf(*f);
      src.tensors.push_back(std::move(t));
    }
  }
  if (src.tensors.empty()) return Status::InvalidArgument("nccl update: empty manifest");
  return src;
}

}  // namespace

ReplicaWeights::ReplicaWeights(engine::Engine& engine, std::string name)
    : engine_(engine), name_(std::move(name)) {}

ReplicaWeights::~ReplicaWeights() = default;

Status ReplicaWeights::Install(std::shared_ptr<const engine::ModelWeights> w, uint64_t version) {
  BR_RETURN_IF_ERROR(engine_.InstallWeights(std::move(w), version));
  version_ = version;
  return Status::Ok();
}

Status ReplicaWeights::Stage(const wire::UpdateWeights& u) {
  if (staging_ == nullptr || staging_version_ != u.version()) {
    if (staging_ != nullptr || staging_failed_) {
      spdlog::warn("replica={} drops the staged update version={} (version={} arrived)", name_,
                   staging_version_, u.version());
    }
    std::shared_ptr<const engine::ModelWeights> base = engine_.weights();
    if (base == nullptr) {
      return Status::Unsupported("this replica's engine has no weights to stream into");
    }
    staging_ = std::make_unique<engine::WeightStager>(std::move(base));
    staging_version_ = u.version();
    staging_failed_ = false;
    staging_error_ = Status::Ok();
  }
  if (u.tensors() == nullptr) return Status::Ok();
  for (const wire::TensorFrame* f : *u.tensors()) {
    const std::string_view name = f->name() ? f->name()->string_view() : std::string_view();
    BR_ASSIGN_OR_RETURN(kernels::DType dtype,
                        ParseDType(f->dtype() ? f->dtype()->string_view() : ""));
    const std::vector<int64_t> shape = ShapeOf(*f);
    std::span<const uint8_t> data;
    if (f->data() != nullptr) data = {f->data()->data(), f->data()->size()};
    BR_RETURN_IF_ERROR(staging_->Put({name, dtype, shape, f->offset(), data}));
  }
  return Status::Ok();
}

Status ReplicaWeights::Apply(const wire::UpdateWeights& u) {
  const bool streamed = u.tensors() != nullptr || u.more();
  if (u.path() != nullptr && u.path()->size() > 0) {
    if (streamed || u.nccl() != nullptr) {
      return Status::InvalidArgument("UpdateWeights: give one of path, tensors or nccl");
    }
    BR_RETURN_IF_ERROR(engine_.UpdateWeights(u.path()->str(), u.version()));
    version_ = u.version();
    return Status::Ok();
  }
  if (u.nccl() != nullptr) {
    if (streamed) return Status::InvalidArgument("UpdateWeights: give one of tensors or nccl");
    BR_ASSIGN_OR_RETURN(engine::NcclWeightSource src, NcclSourceOf(*u.nccl()));
    std::shared_ptr<const engine::ModelWeights> base = engine_.weights();
    if (base == nullptr) {
      return Status::Unsupported("this replica's engine has no weights to update");
    }
    BR_ASSIGN_OR_RETURN(engine::ModelWeights w, engine::ReceiveNcclWeights(src, std::move(base)));
    return Install(std::make_shared<const engine::ModelWeights>(std::move(w)), u.version());
  }
  if (u.abort()) {
    if (staging_version_ == u.version()) {
      staging_.reset();
      staging_failed_ = false;
    }
    return Status::Ok();
  }
  // A streamed part or its commit.
  if (staging_failed_ && staging_version_ == u.version()) return staging_error_;
  Status s = Stage(u);
  if (s.ok() && !u.more()) {
    Result<engine::ModelWeights> w = staging_->Finish(u.full());
    staging_.reset();
    if (w.ok()) {
      spdlog::info("replica={} installs streamed weights version={}", name_, u.version());
      return Install(std::make_shared<const engine::ModelWeights>(std::move(*w)), u.version());
    }
    s = w.status();
  }
  if (!s.ok()) {
    staging_.reset();
    staging_failed_ = true;
    staging_version_ = u.version();
    staging_error_ = s;
  }
  return s;
}

}  // namespace bitroll::rollout
