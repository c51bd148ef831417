// Implementations of the supported decoders (ByteLevel, ByteFallback, Fuse,
// Strip, Replace, Metaspace, Sequence) after Hugging Face `tokenizers`.
#include "lockstep/tokenizer/decoder.h"

#include "lockstep/base/excerpt.h"
#include "lockstep/tokenizer/byte_level.h"
#include "lockstep/tokenizer/normalizer.h"
#include "lockstep/tokenizer/unicode.h"

namespace lockstep::tokenizer {
namespace {

class ByteLevelDecoder : public Decoder {
 public:
  void apply(std::vector<std::string>& tokens) const override {
    std::string bytes;
    for (const auto& t : tokens) {
      // A token with characters outside the byte alphabet (an added token such
      // as "<｜User｜>") contributes its own UTF-8.
      if (!byte_level_decode(t, bytes)) bytes += t;
    }
    tokens.assign(1, std::move(bytes));
  }
  bool is_byte_level() const override { return true; }
};

// Runs of "<0xAB>" tokens become the bytes they name. A run that is not valid
// UTF-8 becomes one U+FFFD per byte token, as in HF.
class ByteFallbackDecoder : public Decoder {
 public:
  void apply(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    std::string run;
    size_t run_tokens = 0;
    auto flush = [&]() {
      if (run_tokens == 0) return;
      if (utf8_is_valid(run)) {
        out.push_back(run);
      } else {
        for (size_t i = 0; i < run_tokens; ++i) out.emplace_back("\xEF\xBF\xBD");
      }
      run.clear();
      run_tokens = 0;
    };
    for (auto& t : tokens) {
      int byte = parse_byte_token(t);
      if (byte >= 0) {
        run.push_back(static_cast<char>(byte));
        ++run_tokens;
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    tokens.swap(out);
  }

  bool decodes_byte_runs() const override { return true; }

  static int parse_byte_token(const std::string& t) {
    if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
    auto hex = [](char c) {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'A' && c <= 'F') return c - 'A' + 10;
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      return -1;
    };
    int hi = hex(t[3]), lo = hex(t[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
  }
};

class FuseDecoder : public Decoder {
 public:
  void apply(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const auto& t : tokens) all += t;
    tokens.assign(1, std::move(all));
  }
};

// Removes up to `start` leading and `stop` trailing copies of `content` from each token.
class StripDecoder : public Decoder {
 public:
  StripDecoder(std::string content, size_t start, size_t stop) : content_(std::move(content)), start_(start), stop_(stop) {}
  void apply(std::vector<std::string>& tokens) const override {
    for (auto& t : tokens) {
      size_t b = 0, e = t.size();
      for (size_t i = 0; i < start_ && e - b >= content_.size() && t.compare(b, content_.size(), content_) == 0; ++i)
        b += content_.size();
      for (size_t i = 0; i < stop_ && e - b >= content_.size() &&
                         t.compare(e - content_.size(), content_.size(), content_) == 0;
           ++i)
        e -= content_.size();
      t = t.substr(b, e - b);
    }
  }

 private:
  std::string content_;
  size_t start_, stop_;
};

class ReplaceDecoder : public Decoder {
 public:
  ReplaceDecoder(Regex re, std::string content) : re_(std::move(re)), content_(std::move(content)) {}
  void apply(std::vector<std::string>& tokens) const override {
    std::vector<Span> spans;
    for (auto& t : tokens) {
      if (!utf8_is_valid(t)) continue;  // raw bytes from an earlier step: nothing to match
      spans.clear();
      re_.find_all(t, spans);
      if (spans.empty()) continue;
      std::string out;
      size_t prev = 0;
      for (const Span& s : spans) {
        out.append(t, prev, s.begin - prev);
        out += content_;
        prev = s.end;
      }
      out.append(t, prev, std::string::npos);
      t = std::move(out);
    }
  }

 private:
  Regex re_;
  std::string content_;
};

// Metaspace: the replacement character (default '▁') becomes a space; in the
// first token it is dropped when a prefix space was prepended at encode time.
class MetaspaceDecoder : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, bool strip_first) : replacement_(std::move(replacement)), strip_first_(strip_first) {}
  void apply(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string& t = tokens[i];
      std::string out;
      size_t prev = 0, at;
      while ((at = t.find(replacement_, prev)) != std::string::npos) {
        out.append(t, prev, at - prev);
        if (!(i == 0 && strip_first_)) out.push_back(' ');
        prev = at + replacement_.size();
      }
      out.append(t, prev, std::string::npos);
      t = std::move(out);
    }
  }

 private:
  std::string replacement_;
  bool strip_first_;
};

class SequenceDecoder : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> parts) : parts_(std::move(parts)) {}
  void apply(std::vector<std::string>& tokens) const override {
    for (const auto& p : parts_) p->apply(tokens);
  }
  bool is_byte_level() const override { return parts_.size() == 1 && parts_[0]->is_byte_level(); }
  bool decodes_byte_runs() const override {
    for (const auto& p : parts_)
      if (p->decodes_byte_runs()) return true;
    return false;
  }

 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

}  // namespace

std::unique_ptr<Decoder> make_decoder(const Json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  std::string type = component_type(j, where);
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Strip") {
    int64_t start = get_int(j, "start", where, 0), stop = get_int(j, "stop", where, 0);
    if (start < 0 || stop < 0) LS_THROW << where << ": start and stop must be >= 0";
    return std::make_unique<StripDecoder>(require_string(j, "content", where), static_cast<size_t>(start),
                                          static_cast<size_t>(stop));
  }
  if (type == "Replace") {
    return std::make_unique<ReplaceDecoder>(make_pattern(require_field(j, "pattern", where), field_path(where, "pattern")),
                                            require_string(j, "content", where));
  }
  if (type == "Metaspace") {
    std::string repl = optional_string(j, "replacement", where).value_or("\xE2\x96\x81");
    bool strip_first;
    if (auto scheme = optional_string(j, "prepend_scheme", where)) {
      if (*scheme != "always" && *scheme != "first" && *scheme != "never")
        LS_THROW << field_path(where, "prepend_scheme") << ": unknown value '" << excerpt(*scheme) << "'";
      strip_first = *scheme != "never";
    } else {
      strip_first = get_bool(j, "add_prefix_space", where, true);
    }
    return std::make_unique<MetaspaceDecoder>(repl, strip_first);
  }
  if (type == "Sequence") {
    const Json& list = require_array(j, "decoders", where);
    std::vector<std::unique_ptr<Decoder>> parts;
    for (size_t i = 0; i < list.size(); ++i) {
      auto p = make_decoder(list[i], index_path(field_path(where, "decoders"), i));
      if (p) parts.push_back(std::move(p));
    }
    return std::make_unique<SequenceDecoder>(std::move(parts));
  }
  LS_THROW
      << field_path(where, "type") << ": decoder '" << excerpt(type)
      << "' is not supported (supported: ByteLevel, ByteFallback, Fuse, Strip, Replace, Metaspace, Sequence)";
}

}  // namespace lockstep::tokenizer
