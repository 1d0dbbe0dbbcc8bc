// rollout/fuzz_decode.cc: fuzz target for the wire decoder (CheckMessage).
//
// With clang it is a libFuzzer target (-fsanitize=fuzzer,address,undefined):
//   ./fuzz_decode -max_total_time=60 corpus/
// With another compiler it builds as a replay driver: ./fuzz_decode FILE... runs each file once.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <vector>

#include "rollout/protocol.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  bitroll::rollout::DecodeLimits decode;
  decode.max_message_bytes = 1 << 20;
  bitroll::rollout::SubmitLimits submit;
  submit.vocab_size = 512;
  (void)bitroll::rollout::CheckMessage(data, size, decode, submit);
  return 0;
}

#ifndef BITROLL_LIBFUZZER
int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::ifstream in(argv[i], std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "fuzz_decode: cannot read %s\n", argv[i]);
      return 1;
    }
    std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), {});
    LLVMFuzzerTestOneInput(bytes.data(), bytes.size());
  }
  std::printf("fuzz_decode: replayed %d input(s)\n", argc - 1);
  return 0;
}
#endif
