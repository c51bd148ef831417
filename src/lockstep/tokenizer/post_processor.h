// Post-processors of tokenizer.json ("post_processor" field): the special
// tokens `encode(..., add_special_tokens=true)` puts around a single sequence.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/tokenizer/json_fields.h"

namespace lockstep::tokenizer {

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  // Adds the special tokens of the single-sequence template to `ids`.
  virtual void apply(std::vector<int32_t>& ids) const = 0;
};

// nullptr for JSON null or for processors that add nothing to ids (ByteLevel).
std::unique_ptr<PostProcessor> make_post_processor(const Json& j, const std::string& where);

// A processor that puts `prefix` before and `suffix` after the ids.
std::unique_ptr<PostProcessor> make_wrap_post_processor(std::vector<int32_t> prefix, std::vector<int32_t> suffix);

}  // namespace lockstep::tokenizer
