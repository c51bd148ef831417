// shortest() and count_of() (number_text.h).
#include "lockstep/base/number_text.h"

#include <charconv>
#include <cmath>

namespace lockstep {

std::string shortest(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  // No precision argument: the fewest digits that round-trip. Laid out as
  // Python's repr does: positional for exponents in [-4, 16), else
  // scientific with a bare exponent (3e-4 -> "0.0003", 1e-20 -> "1e-20").
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  const size_t e = sci.find('e');
  const int exp = std::stoi(sci.substr(e + 1));
  if (exp >= -4 && exp < 16) {
    res = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::fixed);
    return std::string(buf, res.ptr);
  }
  std::string mantissa = sci.substr(0, e), sign = exp < 0 ? "-" : "";
  return mantissa + "e" + sign + std::to_string(exp < 0 ? -exp : exp);
}

std::string count_of(int64_t n, const std::string& noun) {
  return std::to_string(n) + " " + noun + (n == 1 ? "" : "s");
}

}  // namespace lockstep
