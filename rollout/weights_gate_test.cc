// WeightsGate alone (rollout/weights_gate.h), over fake hooks and a ReplicaSet without sockets:
// an update goes live only once every live replica answered, a draining swap waits for the
// samples in flight, failures leave the live version as it was, streamed parts are staged and
// replayed to a late joiner, and held samples are released when their version goes live.
#include "rollout/weights_gate.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

namespace bitroll::rollout {
namespace {

struct Sent {
  int replica;
  uint64_t request_id;
  std::string path;
  uint64_t version;
  bool abort;
  size_t tensors;
};

struct Reply {
  std::string client;
  uint64_t request_id;
  ErrorCode code;
  uint64_t version;
};

// Records what the gate sends and answers.
struct Fakes {
  std::vector<Sent> sent;
  std::vector<Reply> replies;
  std::vector<WeightsGate::Installed> installed;

  WeightsGate::Hooks Hooks() {
    return WeightsGate::Hooks{
        [this](int r, std::string_view b) {
          auto env = DecodeEnvelope(b.data(), b.size(), DecodeLimits{});
          ASSERT_TRUE(env.ok()) << env.status().ToString();
          const wire::UpdateWeights* u = (*env)->msg_as_UpdateWeights();
          ASSERT_NE(u, nullptr);
          sent.push_back({r, (*env)->request_id(), u->path() ? u->path()->str() : "", u->version(),
                          u->abort(), u->tensors() ? u->tensors()->size() : 0});
        },
        [this](const std::string& c, uint64_t id, const Status& s, uint64_t v) {
          replies.push_back({c, id, s.code(), v});
        },
        [this](const WeightsGate::Installed& w) { installed.push_back(w); }};
  }
};

// An UpdateWeights envelope: a path, or (path empty) one streamed tensor part.
struct Update {
  std::string bytes;
  const wire::Envelope* env = nullptr;

  static Update Path(uint64_t rid, const std::string& path, uint64_t version, bool drain) {
    flatbuffers::FlatBufferBuilder fbb(256);
    auto m = wire::CreateUpdateWeights(fbb, fbb.CreateString(path), version, drain);
    FinishEnvelope(fbb, rid, wire::Message_UpdateWeights, m.Union());
    return Update(BufferView(fbb));
  }
  static Update Part(uint64_t rid, uint64_t version, uint32_t part, bool more) {
    flatbuffers::FlatBufferBuilder fbb(256);
    const std::vector<uint8_t> data = {1, 2, 3, 4};
    auto f = wire::CreateTensorFrame(fbb, fbb.CreateString("w"), fbb.CreateString("f32"),
                                     fbb.CreateVector(std::vector<int64_t>{1}),
                                     fbb.CreateVector(data), 0);
    std::vector<flatbuffers::Offset<wire::TensorFrame>> frames = {f};
    auto m = wire::CreateUpdateWeights(fbb, 0, version, false, fbb.CreateVector(frames), more,
                                       false, 0, false, part);
    FinishEnvelope(fbb, rid, wire::Message_UpdateWeights, m.Union());
    return Update(BufferView(fbb));
  }
  explicit Update(std::string_view b) : bytes(b) {
    auto e = DecodeEnvelope(bytes.data(), bytes.size(), DecodeLimits{});
    EXPECT_TRUE(e.ok());
    env = *e;
  }
};

int Join(ReplicaSet& set, const std::string& identity) {
  bool rejoined = false;
  const int r = set.Join(identity, &rejoined);
  set[r].name = identity;
  set[r].alive = true;
  set[r].last_seen = Clock::now();
  return r;
}

void Send(WeightsGate& gate, const std::string& client, const Update& u, size_t in_flight = 0) {
  gate.OnUpdate(client, u.env, u.bytes.data(), u.bytes.size());
  gate.MaybeSend(in_flight);
}

TEST(WeightsGate, PathGoesLiveOnceEveryLiveReplicaAnswered) {
  ReplicaSet set;
  Join(set, "a");
  Join(set, "b");
  Fakes f;
  WeightsGate gate(set, DecodeLimits{}, 1000, f.Hooks());
  Send(gate, "c", Update::Path(7, "/w5", 5, false));
  ASSERT_EQ(f.sent.size(), 2u);
  EXPECT_EQ(f.sent[0].path, "/w5");
  EXPECT_EQ(f.sent[1].replica, 1);
  const uint64_t rid = f.sent[0].request_id;
  gate.OnReplicaAck(0, rid, 0xabc);
  EXPECT_TRUE(f.replies.empty());  // b has not answered
  EXPECT_EQ(gate.version(), 0u);
  gate.OnReplicaAck(1, rid, 0);
  ASSERT_EQ(f.installed.size(), 1u);
  EXPECT_EQ(f.installed[0].version, 5u);
  EXPECT_STREQ(f.installed[0].source, "path");
  EXPECT_EQ(f.installed[0].path, "/w5");
  EXPECT_EQ(f.installed[0].weights_hash, 0xabcu);
  ASSERT_EQ(f.replies.size(), 1u);
  EXPECT_EQ(f.replies[0].code, ErrorCode::kOk);
  EXPECT_EQ(f.replies[0].request_id, 7u);
  EXPECT_EQ(f.replies[0].version, 5u);
  EXPECT_EQ(gate.version(), 5u);
  EXPECT_EQ(gate.live_weights_hash(), 0xabcu);
}

TEST(WeightsGate, DrainHoldsTheSwapAndDispatchUntilNothingIsInFlight) {
  ReplicaSet set;
  Join(set, "a");
  Fakes f;
  WeightsGate gate(set, DecodeLimits{}, 1000, f.Hooks());
  Send(gate, "c", Update::Path(1, "/w2", 2, /*drain=*/true), /*in_flight=*/3);
  EXPECT_TRUE(f.sent.empty());
  EXPECT_TRUE(gate.HoldsDispatch());
  EXPECT_TRUE(gate.draining());
  gate.MaybeSend(1);
  EXPECT_TRUE(f.sent.empty());
  gate.MaybeSend(0);
  ASSERT_EQ(f.sent.size(), 1u);
  gate.OnReplicaAck(0, f.sent[0].request_id, 0);
  EXPECT_FALSE(gate.HoldsDispatch());
  EXPECT_EQ(gate.version(), 2u);
}

TEST(WeightsGate, FailuresLeaveTheLiveVersion) {
  ReplicaSet set;
  Join(set, "a");
  Join(set, "b");
  Fakes f;
  WeightsGate gate(set, DecodeLimits{}, 1000, f.Hooks());
  Send(gate, "c", Update::Path(1, "/w1", 1, false));
  gate.OnReplicaAck(0, f.sent[0].request_id, 0);
  gate.OnReplicaAck(1, f.sent[0].request_id, 0);
  ASSERT_EQ(gate.version(), 1u);
  // A replica error: the client gets it, the version stays.
  Send(gate, "c", Update::Path(2, "/w2", 2, false));
  const uint64_t rid = f.sent.back().request_id;
  gate.OnReplicaError(0, rid, Status::InvalidArgument("bad file"));
  gate.OnReplicaAck(1, rid, 0);
  ASSERT_EQ(f.replies.size(), 2u);
  EXPECT_EQ(f.replies[1].code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(gate.version(), 1u);
  // Every replica dies before answering: Unavailable.
  Send(gate, "c", Update::Path(3, "/w3", 3, false));
  set[0].alive = false;
  gate.OnReplicaGone(0);
  set[1].alive = false;
  gate.OnReplicaGone(1);
  ASSERT_EQ(f.replies.size(), 3u);
  EXPECT_EQ(f.replies[2].code, ErrorCode::kUnavailable);
  EXPECT_EQ(gate.version(), 1u);
  EXPECT_EQ(f.installed.size(), 1u);
}

TEST(WeightsGate, OneUpdateAtATimeAndExactlyOneSource) {
  ReplicaSet set;
  Join(set, "a");
  Fakes f;
  WeightsGate gate(set, DecodeLimits{}, 1000, f.Hooks());
  Send(gate, "c", Update::Path(1, "", 1, false));
  ASSERT_EQ(f.replies.size(), 1u);
  EXPECT_EQ(f.replies[0].code, ErrorCode::kInvalidArgument);
  Send(gate, "c", Update::Path(2, "/w1", 1, false));
  Send(gate, "d", Update::Path(3, "/w2", 2, false));
  ASSERT_EQ(f.replies.size(), 2u);
  EXPECT_EQ(f.replies[1].code, ErrorCode::kFailedPrecondition);
  EXPECT_EQ(f.replies[1].request_id, 3u);
}

TEST(WeightsGate, PartsStageThenACommitGoesLiveAndIsReplayedToALateJoiner) {
  ReplicaSet set;
  Join(set, "a");
  Fakes f;
  WeightsGate gate(set, DecodeLimits{}, 60000, f.Hooks());
  Send(gate, "c", Update::Part(1, 4, 0, /*more=*/true));
  ASSERT_EQ(f.sent.size(), 1u);
  gate.OnReplicaAck(0, f.sent[0].request_id, 0);
  ASSERT_EQ(f.replies.size(), 1u);
  EXPECT_EQ(f.replies[0].version, 0u);  // staged: the live version is still 0
  EXPECT_TRUE(f.installed.empty());
  // A part out of order is refused; the stream stays open.
  Send(gate, "c", Update::Part(2, 4, 5, true));
  ASSERT_EQ(f.replies.size(), 2u);
  EXPECT_EQ(f.replies[1].code, ErrorCode::kFailedPrecondition);
  Send(gate, "c", Update::Part(3, 4, 1, /*more=*/false));
  ASSERT_EQ(f.sent.size(), 2u);
  gate.OnReplicaAck(0, f.sent[1].request_id, 0);
  ASSERT_EQ(f.installed.size(), 1u);
  EXPECT_STREQ(f.installed[0].source, "tensors");
  EXPECT_EQ(gate.version(), 4u);
  // A replica joining at version 0 gets both parts, in order, as catch-ups.
  const int late = Join(set, "late");
  gate.CatchUp(late);
  ASSERT_EQ(f.sent.size(), 4u);
  EXPECT_EQ(f.sent[2].replica, late);
  EXPECT_EQ(f.sent[2].request_id, f.sent[0].request_id);
  EXPECT_EQ(f.sent[3].request_id, f.sent[1].request_id);
  EXPECT_EQ(set[late].catchup.size(), 2u);
  gate.OnReplicaError(late, f.sent[3].request_id, Status::Internal("replay failed"));
  EXPECT_TRUE(set[late].stale);
  EXPECT_EQ(f.replies.size(), 3u);  // a catch-up answers no client
}

TEST(WeightsGate, AStreamWithoutPartsIsAbandoned) {
  ReplicaSet set;
  Join(set, "a");
  Fakes f;
  WeightsGate gate(set, DecodeLimits{}, /*stream_timeout_ms=*/0, f.Hooks());
  Send(gate, "c", Update::Part(1, 4, 0, true));
  gate.OnReplicaAck(0, f.sent[0].request_id, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  gate.MaybeSend(0);
  ASSERT_EQ(f.sent.size(), 2u);
  EXPECT_TRUE(f.sent[1].abort);
  Send(gate, "c", Update::Part(2, 4, 1, false));  // the stream is gone: part 0 expected
  EXPECT_EQ(f.replies.back().code, ErrorCode::kFailedPrecondition);
  EXPECT_EQ(gate.version(), 0u);
}

TEST(WeightsGate, HeldSamplesRunOnceTheirVersionIsLive) {
  ReplicaSet set;
  Join(set, "a");
  Fakes f;
  WeightsGate gate(set, DecodeLimits{}, 1000, f.Hooks());
  EXPECT_TRUE(gate.Admit(1, 0));
  EXPECT_FALSE(gate.Admit(2, 3));
  EXPECT_FALSE(gate.Admit(3, 5));
  EXPECT_TRUE(gate.TakeRunnable().empty());
  Send(gate, "c", Update::Path(1, "/w3", 3, false));
  gate.OnReplicaAck(0, f.sent[0].request_id, 0);
  EXPECT_EQ(gate.TakeRunnable(), std::vector<uint64_t>{2});
  ASSERT_EQ(gate.held().size(), 1u);
  EXPECT_EQ(gate.held()[0].first, 3u);
  EXPECT_TRUE(gate.Admit(4, 3));
}

}  // namespace
}  // namespace bitroll::rollout
