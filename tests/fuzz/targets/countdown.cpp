// Fuzz target: the countdown verifier (equation extraction, parsing with
// exact rational arithmetic, number use and target checks). Input: 1 byte
// count k, then k numbers and the target as 2-byte little-endian values
// (signed), then the response text.
#include "lockstep/reward/countdown.h"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_common.h"

using namespace lockstep::reward;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const size_t k = data[0] % 8;
  size_t pos = 1;
  auto next = [&]() -> int64_t {
    if (pos + 2 > size) return 0;
    const int16_t v = int16_t(uint16_t(data[pos]) | uint16_t(data[pos + 1]) << 8);
    pos += 2;
    return v;
  };
  std::vector<int64_t> numbers;
  for (size_t i = 0; i < k; ++i) numbers.push_back(next());
  const int64_t target = next();
  const std::string_view response(reinterpret_cast<const char*>(data) + std::min(pos, size),
                                  size - std::min(pos, size));

  const std::string equation = countdown_equation(response);
  for (const std::string_view eq : {std::string_view(equation), response}) {
    const CountdownCheck c = check_countdown(eq, target, numbers);
    LS_FUZZ_EXPECT(!c.reaches_target || (c.well_formed && c.value), "reached without a value");
    if (!c.well_formed) LS_FUZZ_EXPECT(!c.numbers_ok && !c.reaches_target, "ill-formed yet checked");
  }
  return 0;
}
