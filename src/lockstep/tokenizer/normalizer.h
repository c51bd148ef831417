// Normalizers of tokenizer.json ("normalizer" field): Unicode forms, lowercase,
// strip, prepend, replace, byte-level, and sequences of those.
#pragma once

#include <memory>
#include <string>

#include "lockstep/tokenizer/json_fields.h"
#include "lockstep/tokenizer/regex.h"

namespace lockstep::tokenizer {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // Rewrites `s` (valid UTF-8) in place.
  virtual void apply(std::string& s) const = 0;
};

// Builds the normalizer described by `j`; nullptr for JSON null. Unsupported
// types throw an Error naming `where` (e.g. "tokenizer.json: normalizer").
std::unique_ptr<Normalizer> make_normalizer(const Json& j, const std::string& where);

// A {"String": "..."} (literal) or {"Regex": "..."} pattern, as Replace and Split use.
Regex make_pattern(const Json& j, const std::string& where);

}  // namespace lockstep::tokenizer
