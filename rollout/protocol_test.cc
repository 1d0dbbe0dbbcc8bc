// Tests of rollout/protocol.{h,cc}: the decoder refuses every malformed, unknown, wrong-version,
// oversized or absurd message with the exact typed error, and survives 10k mutated inputs.
#include "rollout/protocol.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>

#include "rollout/client.h"
#include "rollout/messages.h"

namespace bitroll::rollout {
namespace {

SubmitRequest GoodRequest() {
  SubmitRequest q;
  q.group_id = 7;
  q.prompts = {{1, 5, 9, 200}, {3, 4}};
  q.n = 4;
  q.seed = 42;
  q.max_tokens = 16;
  q.stop_ids = {10};
  q.client_tag = "t";
  return q;
}

SubmitLimits Limits() {
  SubmitLimits l;
  l.vocab_size = 512;
  return l;
}

Status Check(const std::string& bytes, const DecodeLimits& d = {}) {
  return CheckMessage(bytes.data(), bytes.size(), d, Limits());
}

TEST(ProtocolTest, GoodSubmitPasses) {
  const std::string bytes = EncodeSubmit(GoodRequest(), 3);
  EXPECT_TRUE(Check(bytes).ok()) << Check(bytes).ToString();
  auto env = DecodeEnvelope(bytes.data(), bytes.size(), {});
  ASSERT_TRUE(env.ok());
  EXPECT_EQ((*env)->request_id(), 3u);
  EXPECT_EQ((*env)->msg_type(), wire::Message_SubmitRollouts);
  EXPECT_EQ((*env)->msg_as_SubmitRollouts()->n(), 4u);
}

TEST(ProtocolTest, TooShortAndWrongIdentifier) {
  Status s = Check("abc");
  EXPECT_EQ(s.code(), ErrorCode::kProtocol);
  EXPECT_EQ(s.message(), "message of 3 bytes is too short");
  std::string bytes = EncodeSubmit(GoodRequest(), 1);
  bytes[4] = 'X';  // the file identifier sits at offset 4
  s = Check(bytes);
  EXPECT_EQ(s.code(), ErrorCode::kProtocol);
  EXPECT_EQ(s.message(), "message lacks the BRL1 file identifier");
}

TEST(ProtocolTest, TruncatedFailsVerifier) {
  const std::string bytes = EncodeSubmit(GoodRequest(), 1);
  const Status s = Check(bytes.substr(0, bytes.size() / 2));
  EXPECT_EQ(s.code(), ErrorCode::kProtocol);
  EXPECT_EQ(s.message(), "message fails the FlatBuffers verifier");
}

TEST(ProtocolTest, RootOffsetOutOfBoundsFailsVerifier) {
  std::string bytes = EncodeSubmit(GoodRequest(), 1);
  bytes[0] = '\xff';
  bytes[1] = '\xff';
  const Status s = Check(bytes);
  EXPECT_EQ(s.code(), ErrorCode::kProtocol);
  EXPECT_EQ(s.message(), "message fails the FlatBuffers verifier");
}

TEST(ProtocolTest, WrongProtocolVersion) {
  flatbuffers::FlatBufferBuilder fbb;
  auto st = wire::CreateStatus(fbb);
  auto env = wire::CreateEnvelope(fbb, kProtocolVersion + 1, 9, wire::Message_Status, st.Union());
  wire::FinishEnvelopeBuffer(fbb, env);
  const Status s = Check(std::string(BufferView(fbb)));
  EXPECT_EQ(s.code(), ErrorCode::kProtocol);
  EXPECT_EQ(s.message(), "protocol version 2 is not supported (this build speaks 1)");
}

TEST(ProtocolTest, UnknownAndEmptyMessageType) {
  flatbuffers::FlatBufferBuilder fbb;
  auto st = wire::CreateStatus(fbb);
  auto env =
      wire::CreateEnvelope(fbb, kProtocolVersion, 0, static_cast<wire::Message>(200), st.Union());
  wire::FinishEnvelopeBuffer(fbb, env);
  Status s = Check(std::string(BufferView(fbb)));
  EXPECT_EQ(s.code(), ErrorCode::kProtocol);
  EXPECT_EQ(s.message(), "unknown message type 200");

  flatbuffers::FlatBufferBuilder fbb2;
  auto env2 = wire::CreateEnvelope(fbb2, kProtocolVersion, 0);
  wire::FinishEnvelopeBuffer(fbb2, env2);
  s = Check(std::string(BufferView(fbb2)));
  EXPECT_EQ(s.code(), ErrorCode::kProtocol);
  EXPECT_EQ(s.message(), "unknown message type 0");
}

TEST(ProtocolTest, OversizedMessage) {
  SubmitRequest q = GoodRequest();
  q.prompts = {std::vector<int32_t>(4096, 5)};
  const std::string bytes = EncodeSubmit(q, 1);
  DecodeLimits d;
  d.max_message_bytes = 1024;
  const Status s = Check(bytes, d);
  EXPECT_EQ(s.code(), ErrorCode::kResourceExhausted);
  EXPECT_EQ(s.message(),
            "message of " + std::to_string(bytes.size()) + " bytes exceeds the limit of 1024");
}

TEST(ProtocolTest, AbsurdParams) {
  SubmitRequest q = GoodRequest();
  q.n = 1000000000;
  Status s = Check(EncodeSubmit(q, 1));
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "n = 1000000000 is outside [1, 4096]");

  q = GoodRequest();
  q.n = 0;
  EXPECT_EQ(Check(EncodeSubmit(q, 1)).code(), ErrorCode::kInvalidArgument);

  q = GoodRequest();
  q.max_tokens = -5;
  s = Check(EncodeSubmit(q, 1));
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "max_tokens = -5 is outside [1, 1048576]");

  q = GoodRequest();
  q.prompts[1][1] = 512;  // vocab is [0, 512)
  s = Check(EncodeSubmit(q, 1));
  EXPECT_EQ(s.code(), ErrorCode::kOutOfRange);
  EXPECT_EQ(s.message(), "prompt 1: token id 512 at 1 is outside the vocabulary [0, 512)");

  q = GoodRequest();
  q.prompts[0][0] = -1;
  EXPECT_EQ(Check(EncodeSubmit(q, 1)).code(), ErrorCode::kOutOfRange);

  q = GoodRequest();
  q.stop_ids = {100000};
  EXPECT_EQ(Check(EncodeSubmit(q, 1)).code(), ErrorCode::kOutOfRange);

  q = GoodRequest();
  q.temperature = std::nanf("");
  s = Check(EncodeSubmit(q, 1));
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(s.message().rfind("temperature must be finite and >= 0, got ", 0), 0u) << s.message();

  q = GoodRequest();
  q.top_p = 0.0f;
  EXPECT_EQ(Check(EncodeSubmit(q, 1)).code(), ErrorCode::kInvalidArgument);

  q = GoodRequest();
  q.prompts = {{}};
  s = Check(EncodeSubmit(q, 1));
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "prompt 0 is empty");

  q = GoodRequest();
  q.prompts.clear();
  s = Check(EncodeSubmit(q, 1));
  EXPECT_EQ(s.message(), "SubmitRollouts has no prompts");

  q = GoodRequest();
  q.max_turns = 0;
  EXPECT_EQ(Check(EncodeSubmit(q, 1)).code(), ErrorCode::kInvalidArgument);
}

// Issue 12 item 7: a positive temperature below 1e-6 (logits / T overflows fp32, every logprob
// was NaN) is refused; 0 (greedy) and 1e-6 and up are accepted, and so are the other sampling
// parameters at the edges of their ranges.
TEST(ProtocolTest, TinyTemperatureIsRefusedAndEdgesAreAccepted) {
  for (float t : {1e-45f, 1e-38f, 1e-10f, 9.9e-7f}) {
    SubmitRequest q = GoodRequest();
    q.temperature = t;
    const Status s = Check(EncodeSubmit(q, 1));
    EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument) << t << ": " << s.ToString();
    EXPECT_NE(s.message().find("temperature must be 0 (greedy) or >= 1e-06"), std::string::npos)
        << s.message();
  }
  for (float t : {0.0f, 1e-6f, 1.0f, 1e30f, 3.4e38f}) {
    SubmitRequest q = GoodRequest();
    q.temperature = t;
    EXPECT_TRUE(Check(EncodeSubmit(q, 1)).ok()) << t;
  }
  for (float t : {INFINITY, -INFINITY, -1e-45f, -0.5f}) {
    SubmitRequest q = GoodRequest();
    q.temperature = t;
    EXPECT_EQ(Check(EncodeSubmit(q, 1)).code(), ErrorCode::kInvalidArgument) << t;
  }
  SubmitRequest q = GoodRequest();
  q.top_p = 1e-45f;
  q.min_p = 1.0f;
  q.top_k = 2147483647;
  EXPECT_TRUE(Check(EncodeSubmit(q, 1)).ok());
  for (float p : {0.0f, -0.1f, 1.0001f, NAN, INFINITY}) {
    q = GoodRequest();
    q.top_p = p;
    EXPECT_EQ(Check(EncodeSubmit(q, 1)).code(), ErrorCode::kInvalidArgument) << p;
    q = GoodRequest();
    q.min_p = p == 0.0f ? -1e-45f : p;
    EXPECT_EQ(Check(EncodeSubmit(q, 1)).code(), ErrorCode::kInvalidArgument) << p;
  }
  q = GoodRequest();
  q.top_k = -1;
  EXPECT_EQ(Check(EncodeSubmit(q, 1)).code(), ErrorCode::kInvalidArgument);
}

TEST(ProtocolTest, ErrorCodesMirrorStatusH) {
  // Every bitroll::ErrorCode has a wire twin with the same value and the same name.
  for (int c = 0; c <= static_cast<int>(wire::ErrorCode_MAX); ++c) {
    const auto code = static_cast<ErrorCode>(c);
    const auto w = ErrorCodeToWire(code);
    EXPECT_EQ(static_cast<int>(w), c);
    EXPECT_EQ(ErrorCodeFromWire(w), code);
    std::string snake;  // "InvalidArgument" -> "invalid_argument"
    for (const char* p = wire::EnumNameErrorCode(w); *p; ++p) {
      if (std::isupper(static_cast<unsigned char>(*p)) && !snake.empty()) snake += '_';
      snake += static_cast<char>(std::tolower(static_cast<unsigned char>(*p)));
    }
    EXPECT_EQ(snake, ErrorCodeName(code)) << c;
  }
  EXPECT_EQ(static_cast<int>(wire::ErrorCode_MAX), static_cast<int>(ErrorCode::kProtocol));
  EXPECT_EQ(ErrorCodeFromWire(static_cast<wire::ErrorCode>(999)), ErrorCode::kInternal);
}

TEST(ProtocolTest, EncodeErrorRoundTrips) {
  const std::string bytes = EncodeError(5, Status::Busy("queue full"), 77);
  auto env = DecodeEnvelope(bytes.data(), bytes.size(), {});
  ASSERT_TRUE(env.ok());
  ASSERT_EQ((*env)->msg_type(), wire::Message_Error);
  const Status s = StatusFromWire((*env)->msg_as_Error());
  EXPECT_EQ(s.code(), ErrorCode::kBusy);
  EXPECT_EQ(s.message(), "queue full");
  EXPECT_EQ((*env)->msg_as_Error()->group_id(), 77u);
}

// Bounded fuzz smoke run: 10k mutations (byte flips, truncation, insertion, splices) of valid
// messages through the fuzz target's function. Nothing may crash; the mix must hit both outcomes.
TEST(ProtocolTest, FuzzSmoke10k) {
  std::vector<std::string> seeds;
  seeds.push_back(EncodeSubmit(GoodRequest(), 1));
  SubmitRequest text = GoodRequest();
  text.prompts.clear();
  text.text_prompts = {"hello", "world"};
  seeds.push_back(EncodeSubmit(text, 2));
  seeds.push_back(EncodeError(3, Status::Timeout("x"), 4));
  {
    flatbuffers::FlatBufferBuilder fbb;
    auto u = wire::CreateUpdateWeights(fbb, fbb.CreateString("/w"), 3, true);
    FinishEnvelope(fbb, 9, wire::Message_UpdateWeights, u.Union());
    seeds.emplace_back(BufferView(fbb));
  }
  // Leave the seeds for the libFuzzer target: fuzz_decode <build>/fuzz_corpus
  const std::string corpus = std::string(BITROLL_BINARY_DIR) + "/fuzz_corpus";
  std::filesystem::create_directories(corpus);
  for (size_t i = 0; i < seeds.size(); ++i) {
    std::ofstream(corpus + "/seed" + std::to_string(i), std::ios::binary) << seeds[i];
  }
  std::mt19937_64 rng(20261129);
  int ok = 0, err = 0;
  for (int i = 0; i < 10000; ++i) {
    std::string m = seeds[rng() % seeds.size()];
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits && !m.empty(); ++e) {
      switch (rng() % 5) {
        case 0:
          m[rng() % m.size()] = static_cast<char>(rng());
          break;
        case 1:
          m.resize(rng() % m.size());
          break;
        case 2:
          m.insert(rng() % m.size(), 1 + rng() % 8, static_cast<char>(rng()));
          break;
        case 3:
          m[rng() % m.size()] ^= static_cast<char>(1u << (rng() % 8));
          break;
        default:
          m.erase(rng() % m.size(), 1 + rng() % 4);
          break;
      }
    }
    const Status s = CheckMessage(m.data(), m.size(), DecodeLimits{}, Limits());
    (s.ok() ? ok : err)++;
    if (!s.ok()) {
      EXPECT_NE(s.code(), ErrorCode::kInternal) << s.ToString();
    }
  }
  EXPECT_GT(err, 1000);
  EXPECT_GT(ok, 10);
}

// A ReplicaWork carries each group's request once, byte for byte, and its items name it.
TEST(ProtocolTest, ReplicaWorkCarriesTheRequestVerbatimOnce) {
  const std::string a = EncodeSubmit(GoodRequest(), 3);
  SubmitRequest other = GoodRequest();
  other.group_id = 8;
  other.seed = 43;
  const std::string b = EncodeSubmit(other, 4);
  ReplicaWorkBuilder builder;
  for (uint32_t j = 0; j < 4; ++j) {
    builder.AddRequest(11, a);  // once: the key is in the message after the first
    builder.Add(11, 100 + j, {7, 1, j});
  }
  builder.AddRequest(12, b);
  builder.Add(12, 200, {8, 0, 0}, {}, false, nullptr);
  EXPECT_TRUE(builder.Holds(11));
  EXPECT_FALSE(builder.Holds(13));
  const std::string msg(builder.Finish());
  auto env = DecodeEnvelope(msg.data(), msg.size(), DecodeLimits{});
  ASSERT_TRUE(env.ok()) << env.status().ToString();
  const wire::ReplicaWork* work = (*env)->msg_as_ReplicaWork();
  ASSERT_NE(work, nullptr);
  ASSERT_EQ(work->requests()->size(), 2u);
  ASSERT_EQ(work->items()->size(), 5u);
  EXPECT_EQ(work->requests()->Get(0)->key(), 11u);
  EXPECT_EQ(work->requests()->Get(1)->key(), 12u);
  EXPECT_FALSE(work->requests()->Get(0)->transient());
  EXPECT_EQ(work->forget(), nullptr);
  const auto* held = work->requests()->Get(0)->envelope();
  ASSERT_EQ(held->size(), a.size());
  EXPECT_EQ(std::memcmp(held->data(), a.data(), a.size()), 0);
  // Negative control: the other group's request is other bytes.
  const auto* held_b = work->requests()->Get(1)->envelope();
  ASSERT_EQ(held_b->size(), b.size());
  EXPECT_EQ(std::memcmp(held_b->data(), b.data(), b.size()), 0);
  EXPECT_NE(std::memcmp(held_b->data(), a.data(), std::min(a.size(), b.size())), 0);
  for (uint32_t k = 0; k < 5; ++k) {
    const wire::WorkItem* w = work->items()->Get(k);
    auto m = RequestOf(*work, *w);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    EXPECT_EQ((*m)->group_id(), k < 4 ? 7u : 8u);
    EXPECT_EQ(SamplingFromWire(**m).seed, k < 4 ? 42u : 43u);
  }
}

TEST(ProtocolTest, WorkItemNamingNoRequestIsAProtocolError) {
  const std::string a = EncodeSubmit(GoodRequest(), 3);
  ReplicaWorkBuilder builder;
  builder.AddRequest(5, a);
  builder.Add(5, 1, {7, 1, 0});
  builder.Add(5, 2, {7, 2, 0});  // GoodRequest has 2 prompts: index 2 is outside
  builder.Add(6, 3, {7, 0, 0});  // a key the message does not carry
  const std::string msg(builder.Finish());
  auto env = DecodeEnvelope(msg.data(), msg.size(), DecodeLimits{});
  ASSERT_TRUE(env.ok());
  const wire::ReplicaWork* work = (*env)->msg_as_ReplicaWork();
  EXPECT_TRUE(RequestOf(*work, *work->items()->Get(0)).ok());
  EXPECT_EQ(RequestOf(*work, *work->items()->Get(1)).status().code(), ErrorCode::kProtocol);
  EXPECT_EQ(RequestOf(*work, *work->items()->Get(2)).status().code(), ErrorCode::kProtocol);
  // An item of replica protocol 1 (no requests in its message) names request 0 of none.
  flatbuffers::FlatBufferBuilder fbb;
  std::vector<flatbuffers::Offset<wire::WorkItem>> items{wire::CreateWorkItem(fbb, 5, 7)};
  auto old = wire::CreateReplicaWork(fbb, fbb.CreateVector(items));
  FinishEnvelope(fbb, 0, wire::Message_ReplicaWork, old.Union());
  auto env1 = DecodeEnvelope(fbb.GetBufferPointer(), fbb.GetSize(), DecodeLimits{});
  ASSERT_TRUE(env1.ok());
  const wire::ReplicaWork* w1 = (*env1)->msg_as_ReplicaWork();
  EXPECT_EQ(RequestOf(*w1, *w1->items()->Get(0)).status().code(), ErrorCode::kProtocol);
  // A nested envelope that holds no SubmitRollouts.
  flatbuffers::FlatBufferBuilder inner;
  FinishEnvelope(inner, 0, wire::Message_Status, wire::CreateStatus(inner).Union());
  const std::string status(BufferView(inner));
  ReplicaWorkBuilder b2;
  b2.AddRequest(1, status);
  b2.Add(1, 1, {7, 0, 0});
  const std::string msg2(b2.Finish());
  auto env2 = DecodeEnvelope(msg2.data(), msg2.size(), DecodeLimits{});
  ASSERT_TRUE(env2.ok());
  const wire::ReplicaWork* w2 = (*env2)->msg_as_ReplicaWork();
  EXPECT_EQ(RequestOf(*w2, *w2->items()->Get(0)).status().code(), ErrorCode::kProtocol);
}

TEST(ProtocolTest, ReplicaHelloOfAnotherReplicaProtocolIsRefused) {
  auto hello = [](uint32_t version) {
    auto fbb = std::make_unique<flatbuffers::FlatBufferBuilder>();
    auto h = wire::CreateReplicaHello(*fbb, fbb->CreateString("r"), 512, 4096, 0, 1, 0, false, -1,
                                      version);
    fbb->Finish(h);
    return fbb;
  };
  auto now = hello(kReplicaProtocolVersion);
  EXPECT_TRUE(
      CheckReplicaHello(*flatbuffers::GetRoot<wire::ReplicaHello>(now->GetBufferPointer())).ok());
  for (uint32_t v : {0u, 1u, kReplicaProtocolVersion + 1}) {  // 0: absent, a replica of version 1
    auto other = hello(v);
    const Status s =
        CheckReplicaHello(*flatbuffers::GetRoot<wire::ReplicaHello>(other->GetBufferPointer()));
    EXPECT_EQ(s.code(), ErrorCode::kProtocol) << v;
  }
}

}  // namespace
}  // namespace bitroll::rollout
