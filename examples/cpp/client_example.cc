// examples/cpp/client_example.cc: submit a group to a bitroll service, print its trajectories,
// then the service status.
//
//   bitroll serve --engine null --replicas 2 --bind tcp://127.0.0.1:5555 &
//   client_example tcp://127.0.0.1:5555
#include <cinttypes>
#include <cstdio>

#include "rollout/client.h"

using bitroll::rollout::Client;
using bitroll::rollout::ClientOptions;
using bitroll::rollout::Event;
using bitroll::rollout::SubmitRequest;

int main(int argc, char** argv) {
  ClientOptions options;
  if (argc > 1) options.endpoint = argv[1];
  auto client = Client::Connect(options);
  if (!client.ok()) {
    std::fprintf(stderr, "%s\n", client.status().ToString().c_str());
    return 1;
  }
  SubmitRequest q;
  q.group_id = 1;
  q.prompts = {{1, 45, 99, 263}};  // token ids (the NullEngine vocabulary is 512)
  q.n = 4;
  q.seed = 7;
  q.max_tokens = 32;
  q.temperature = 1.0f;
  if (auto s = (*client)->Submit(q); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  // Trajectories arrive as each one finishes, then GroupDone.
  while (true) {
    auto e = (*client)->Next(60000);
    if (!e.ok()) {
      std::fprintf(stderr, "%s\n", e.status().ToString().c_str());
      return 1;
    }
    if (e->kind == Event::Kind::kTrajectory) {
      const auto& t = e->trajectory;
      double sum = 0;
      for (float lp : t.logprobs) sum += lp;
      std::printf(
          "sample %u: %zu tokens, sum logprob %.4f, finish %d, replica %s, "
          "engine %.6f s, queue %.6f s\n",
          t.sample_index, t.ids.size(), sum, static_cast<int>(t.finish), t.replica.c_str(),
          t.cost.engine_seconds, t.cost.queue_seconds);
    } else if (e->kind == Event::Kind::kGroupDone) {
      std::printf("group %" PRIu64 " done: %u trajectories, %" PRId64 " decode tokens\n",
                  e->done.group_id, e->done.trajectories, e->done.cost.decode_tokens);
      break;
    } else if (e->kind == Event::Kind::kError) {
      std::fprintf(stderr, "error: %s\n", e->error.ToString().c_str());
      return 1;
    }
  }
  auto st = (*client)->GetStatus(5000);
  if (st.ok()) {
    std::printf("status: %zu replicas, %.0f tok/s, cache hit rate %.2f\n", st->replicas.size(),
                st->tokens_per_s, st->cache_hit_rate);
  }
  return 0;
}
