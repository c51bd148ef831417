// Decoders of tokenizer.json ("decoder" field): turn the token strings of some
// ids back into text, e.g. the byte-level decoder maps 'Ġ' back to ' '.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "lockstep/tokenizer/json_fields.h"

namespace lockstep::tokenizer {

class Decoder {
 public:
  virtual ~Decoder() = default;
  // Rewrites the token strings (HF decode_chain); the caller joins the result.
  // Strings may hold raw bytes that are not UTF-8 yet: the caller repairs the
  // joined text once at the end.
  virtual void apply(std::vector<std::string>& tokens) const = 0;
  // True for a lone ByteLevel decoder: each token then decodes independently,
  // which lets the tokenizer precompute the bytes of every id.
  virtual bool is_byte_level() const { return false; }
  // True when a run of consecutive <0xNN> byte tokens decodes as a whole
  // (ByteFallback): one more byte token can turn the text of the whole run,
  // complete characters included, into U+FFFDs.
  virtual bool decodes_byte_runs() const { return false; }
};

// nullptr for JSON null (tokens are then joined with spaces, as in HF).
std::unique_ptr<Decoder> make_decoder(const Json& j, const std::string& where);

}  // namespace lockstep::tokenizer
