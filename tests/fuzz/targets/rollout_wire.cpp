// Fuzz target: the rollout messages a rank receives over MPI (requests from
// the trainer root, results from rollout ranks). Bytes that decode must
// re-encode to a message that decodes to the same encoding again.
#include "lockstep/rl/rollout_wire.h"

#include <cstdint>
#include <vector>

#include "fuzz_common.h"

using namespace lockstep;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<char> bytes(reinterpret_cast<const char*>(data),
                                reinterpret_cast<const char*>(data) + size);
  std::vector<rollout::Request> requests;
  if (fuzz::run_expecting_error([&] { requests = rl::decode_requests(bytes); })) {
    const std::vector<char> once = rl::encode_requests(requests);
    LS_FUZZ_EXPECT(once.size() == bytes.size(), "requests re-encode to another size");
    LS_FUZZ_EXPECT(rl::encode_requests(rl::decode_requests(once)) == once, "requests round trip");
  }
  std::vector<rollout::RequestResult> results;
  int64_t tokens = 0;
  if (fuzz::run_expecting_error([&] { results = rl::decode_results(bytes, &tokens); })) {
    const std::vector<char> once = rl::encode_results(results, tokens);
    LS_FUZZ_EXPECT(once == bytes, "results re-encode differently");
    int64_t tokens2 = 0;
    LS_FUZZ_EXPECT(rl::encode_results(rl::decode_results(once, &tokens2), tokens2) == once,
                   "results round trip");
  }
  return 0;
}
