// Numbers as users read them: a double in the shortest text that reads back
// to the same bits, and a count with its noun in the right number.
#pragma once

#include <cstdint>
#include <string>

namespace lockstep {

// The fewest digits that parse back to exactly `v`, laid out as Python's repr
// (3e-4 -> "0.0003", 0.1 + 0.2 -> "0.30000000000000004", 1e-20 -> "1e-20",
// 2.0 -> "2"); "inf", "-inf" and "nan" for the non-finite values.
std::string shortest(double v);

// "1 sample", "0 samples", "8 samples": `noun` is the singular, "s" is added.
std::string count_of(int64_t n, const std::string& noun);

}  // namespace lockstep
