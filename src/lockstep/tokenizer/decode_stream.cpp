// Incremental decoding. Each step decodes a short window of ids (some already
// emitted ids as context, so decoders that treat the first token specially
// stay consistent) and emits only the new text that is complete UTF-8.
#include "lockstep/tokenizer/tokenizer_impl.h"
#include "lockstep/tokenizer/unicode.h"

namespace lockstep::tokenizer {
namespace {

// End of the part of s[from..] that can be emitted now: it stops before a
// trailing incomplete (but so far well-formed) UTF-8 sequence, and before a
// trailing run of U+FFFD, which a ByteFallback decoder writes for a byte run
// that a later token may still complete.
size_t emittable_end(std::string_view s, size_t from) {
  size_t i = from;
  size_t fffd_run_start = std::string_view::npos;
  while (i < s.size()) {
    Utf8Step st = utf8_next(s, i);
    if (!st.valid && st.truncated) break;
    if (st.valid && st.cp == kReplacementChar) {
      if (fffd_run_start == std::string_view::npos) fffd_run_start = i;
    } else {
      fffd_run_start = std::string_view::npos;
    }
    i += st.len;
  }
  if (i == s.size() && fffd_run_start != std::string_view::npos) return fffd_run_start;
  if (i < s.size() && fffd_run_start != std::string_view::npos) return fffd_run_start;
  return i;
}

}  // namespace

std::string DecodeStream::step(int32_t id) {
  const Tokenizer::Impl& m = *impl_;
  if (!m.byte_level_bytes.empty()) {
    // A lone ByteLevel decoder decodes each id on its own: append its bytes and
    // emit what is complete, no window needed.
    if (id >= 0 && id < m.vocab_size && m.known[static_cast<size_t>(id)] &&
        !(skip_special_ && m.special[static_cast<size_t>(id)])) {
      pending_ += m.byte_level_bytes[static_cast<size_t>(id)];
    }
    size_t end = emittable_end(pending_, 0);
    if (end == 0) return std::string();
    std::string out = utf8_sanitize(std::string_view(pending_).substr(0, end));
    pending_.erase(0, end);
    return out;
  }
  ids_.push_back(id);
  if (!m.byte_run_token.empty()) {
    // ByteFallback decodes a run of byte tokens as a whole: the run's text is
    // final only once a token that decoding keeps ends it (or at flush), so
    // hold everything back while the last kept id is a byte token. Ids that
    // decoding drops (unknown, skipped specials) do not end a run.
    const bool kept = id >= 0 && id < m.vocab_size && m.known[static_cast<size_t>(id)] &&
                      !(skip_special_ && m.special[static_cast<size_t>(id)]);
    if (kept) in_byte_run_ = m.byte_run_token[static_cast<size_t>(id)] != 0;
    if (in_byte_run_) return std::string();
  }
  std::string full = impl_->decode_bytes(ids_, skip_special_);
  if (full.compare(0, prefix_bytes_.size(), prefix_bytes_) != 0) {
    // The context decodes differently once followed by more ids (no supported
    // decoder does this once ByteFallback runs are held back, as above): drop
    // the context and continue from what was emitted.
    size_t common = 0;
    while (common < full.size() && common < prefix_bytes_.size() && full[common] == prefix_bytes_[common]) ++common;
    prefix_bytes_.resize(common);
  }
  std::string_view delta = std::string_view(full).substr(prefix_bytes_.size());
  if (emitted_ > delta.size()) emitted_ = delta.size();
  size_t end = emittable_end(delta, emitted_);
  std::string out = utf8_sanitize(delta.substr(emitted_, end - emitted_));
  emitted_ = end;
  if (end == delta.size() && end > 0) {
    // Everything is out: the ids after the context become the new context.
    // Not when they gave no text (a skipped special token, a leading space a
    // Strip decoder drops): a context without text would let such a decoder
    // drop the start of the next token, which decode() keeps.
    ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(prefix_ids_));
    prefix_ids_ = ids_.size();
    prefix_bytes_ = impl_->decode_bytes(ids_, skip_special_);
    emitted_ = 0;
  }
  return out;
}

std::string DecodeStream::flush() {
  if (!impl_->byte_level_bytes.empty()) {
    std::string out = utf8_sanitize(pending_);
    pending_.clear();
    return out;
  }
  std::string full = impl_->decode_bytes(ids_, skip_special_);
  std::string out;
  size_t start = std::min(full.size(), prefix_bytes_.size() + emitted_);
  out = utf8_sanitize(std::string_view(full).substr(start));
  ids_.clear();
  in_byte_run_ = false;
  prefix_ids_ = 0;
  prefix_bytes_.clear();
  emitted_ = 0;
  return out;
}

}  // namespace lockstep::tokenizer
