// Implementations of the supported pre-tokenizers, following the semantics of
// Hugging Face `tokenizers` (pattern.rs / normalizer.rs split behaviours).
#include "lockstep/tokenizer/pre_tokenizer.h"

#include "lockstep/base/excerpt.h"
#include "lockstep/tokenizer/byte_level.h"
#include "lockstep/tokenizer/normalizer.h"
#include "lockstep/tokenizer/scratch.h"

namespace lockstep::tokenizer {

const char kGpt2SplitPattern[] = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

namespace {

// Rust regex's Unicode \w and \s, spelled for PCRE2 (Whitespace pre-tokenizer).
constexpr char kWordClass[] = R"(\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\x{200C}\x{200D})";

struct Segment {
  uint32_t begin, end;
  bool match;
};

class SplitPreTokenizer : public PreTokenizer {
 public:
  SplitPreTokenizer(Regex re, bool invert, SplitBehavior b) : re_(std::move(re)), invert_(invert), behavior_(b) {}
  void apply(std::vector<std::string>& pieces) const override {
    std::vector<std::string> out;
    out.reserve(pieces.size() * 4);
    for (const auto& p : pieces) split_by_pattern(p, re_, invert_, behavior_, out);
    pieces.swap(out);
  }
  void apply_spans(std::string_view text, std::vector<Span>& spans) const override {
    thread_local std::vector<Span> out;
    out.clear();
    for (const Span& sp : spans) split_span(text, sp, re_, invert_, behavior_, out);
    spans.swap(out);
    release_if_large(out);
  }
  bool supports_spans() const override { return true; }
  bool ends_with_byte_level() const override { return false; }

 private:
  Regex re_;
  bool invert_;
  SplitBehavior behavior_;
};

class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex)
      : add_prefix_space_(add_prefix_space), use_regex_(use_regex), re_(kGpt2SplitPattern, "ByteLevel split pattern") {}
  void apply(std::vector<std::string>& pieces) const override {
    std::vector<std::string> out;
    out.reserve(pieces.size() * (use_regex_ ? 4 : 1));
    std::vector<std::string> parts;
    std::string spaced;
    for (const auto& p : pieces) {
      // HF adds the space to every piece that reaches it, not only the first one.
      std::string_view text = p;
      if (add_prefix_space_ && (p.empty() || p[0] != ' ')) {
        spaced = " " + p;
        text = spaced;
      }
      if (use_regex_) {
        parts.clear();
        split_by_pattern(text, re_, false, SplitBehavior::Isolated, parts);
        for (const auto& part : parts) {
          out.emplace_back();
          byte_level_encode(part, out.back());
        }
      } else {
        out.emplace_back();
        byte_level_encode(text, out.back());
      }
    }
    pieces.swap(out);
  }
  void apply_spans(std::string_view text, std::vector<Span>& spans) const override {
    if (!use_regex_) return;
    thread_local std::vector<Span> out;
    out.clear();
    for (const Span& sp : spans) split_span(text, sp, re_, false, SplitBehavior::Isolated, out);
    spans.swap(out);
    release_if_large(out);
  }
  // A prefix space changes the text, so that case takes the string path.
  bool supports_spans() const override { return !add_prefix_space_; }
  bool ends_with_byte_level() const override { return true; }

 private:
  bool add_prefix_space_, use_regex_;
  Regex re_;
};

class SequencePreTokenizer : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> parts) : parts_(std::move(parts)) {}
  void apply(std::vector<std::string>& pieces) const override {
    for (const auto& p : parts_) p->apply(pieces);
  }
  void apply_spans(std::string_view text, std::vector<Span>& spans) const override {
    for (const auto& p : parts_) p->apply_spans(text, spans);
  }
  // Cutting on raw text is only the same as cutting on mapped text when the
  // byte-level mapping comes last.
  bool supports_spans() const override {
    for (size_t i = 0; i < parts_.size(); ++i) {
      if (!parts_[i]->supports_spans()) return false;
      if (parts_[i]->ends_with_byte_level() && i + 1 != parts_.size()) return false;
    }
    return true;
  }
  bool ends_with_byte_level() const override { return !parts_.empty() && parts_.back()->ends_with_byte_level(); }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

}  // namespace

SplitBehavior parse_split_behavior(const std::string& name, const std::string& where) {
  if (name == "Removed") return SplitBehavior::Removed;
  if (name == "Isolated") return SplitBehavior::Isolated;
  if (name == "MergedWithPrevious") return SplitBehavior::MergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::MergedWithNext;
  if (name == "Contiguous") return SplitBehavior::Contiguous;
  LS_THROW << where << ": unknown split behavior '" << name
           << "' (expected Removed, Isolated, MergedWithPrevious, MergedWithNext or Contiguous)";
}

void split_span(std::string_view text, Span span, const Regex& re, bool invert, SplitBehavior behavior,
                std::vector<Span>& out) {
  if (span.end <= span.begin) return;
  // The piece is matched on its own, as HF does: anchors and lookarounds do not see its neighbours.
  std::string_view piece = text.substr(span.begin, span.end - span.begin);
  thread_local std::vector<Span> matches;
  thread_local std::vector<Segment> segs;
  const ReleaseIfLarge<Span> release_matches{matches};
  const ReleaseIfLarge<Segment> release_segs{segs};
  matches.clear();
  segs.clear();
  re.find_all(piece, matches);
  auto n = static_cast<uint32_t>(piece.size());
  uint32_t prev = 0;
  for (const Span& m : matches) {
    if (m.begin != prev) segs.push_back({prev, m.begin, invert});
    segs.push_back({m.begin, m.end, !invert});
    prev = m.end;
  }
  if (prev != n) segs.push_back({prev, n, invert});

  uint32_t base = span.begin;
  auto emit = [&](uint32_t b, uint32_t e) {
    if (e > b) out.push_back(Span{base + b, base + e});
  };
  switch (behavior) {
    case SplitBehavior::Isolated:
      for (const auto& s : segs) emit(s.begin, s.end);
      return;
    case SplitBehavior::Removed:
      for (const auto& s : segs)
        if (!s.match) emit(s.begin, s.end);
      return;
    default:
      break;
  }
  // The merging behaviours fold segments into (begin, end) groups first.
  std::vector<std::pair<uint32_t, uint32_t>> groups;
  bool prev_match = false;
  if (behavior == SplitBehavior::MergedWithNext) {
    for (size_t k = segs.size(); k-- > 0;) {
      const Segment& s = segs[k];
      if (s.match && !prev_match && !groups.empty()) {
        groups.back().first = s.begin;
      } else {
        groups.push_back({s.begin, s.end});
      }
      prev_match = s.match;
    }
    for (size_t k = groups.size(); k-- > 0;) emit(groups[k].first, groups[k].second);
    return;
  }
  for (const Segment& s : segs) {
    bool merge = behavior == SplitBehavior::Contiguous ? s.match == prev_match : (s.match && !prev_match);
    if (merge && !groups.empty()) {
      groups.back().second = s.end;
    } else {
      groups.push_back({s.begin, s.end});
    }
    prev_match = s.match;
  }
  for (const auto& g : groups) emit(g.first, g.second);
}

void split_by_pattern(std::string_view piece, const Regex& re, bool invert, SplitBehavior behavior,
                      std::vector<std::string>& out) {
  thread_local std::vector<Span> parts;
  parts.clear();
  split_span(piece, Span{0, static_cast<uint32_t>(piece.size())}, re, invert, behavior, parts);
  for (const Span& p : parts) out.emplace_back(piece.substr(p.begin, p.end - p.begin));
  release_if_large(parts);
}

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const Json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  std::string type = component_type(j, where);
  if (type == "ByteLevel") {
    return std::make_unique<ByteLevelPreTokenizer>(get_bool(j, "add_prefix_space", where, true),
                                                   get_bool(j, "use_regex", where, true));
  }
  if (type == "Split") {
    Regex re = make_pattern(require_field(j, "pattern", where), field_path(where, "pattern"));
    SplitBehavior b = parse_split_behavior(require_string(j, "behavior", where), field_path(where, "behavior"));
    return std::make_unique<SplitPreTokenizer>(std::move(re), get_bool(j, "invert", where, false), b);
  }
  if (type == "Sequence") {
    const Json& list = require_array(j, "pretokenizers", where);
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    for (size_t i = 0; i < list.size(); ++i) {
      auto p = make_pre_tokenizer(list[i], index_path(field_path(where, "pretokenizers"), i));
      if (p) parts.push_back(std::move(p));
    }
    return std::make_unique<SequencePreTokenizer>(std::move(parts));
  }
  if (type == "Digits") {
    bool individual = get_bool(j, "individual_digits", where, false);
    return std::make_unique<SplitPreTokenizer>(Regex(R"(\p{N})", where), false,
                                               individual ? SplitBehavior::Isolated : SplitBehavior::Contiguous);
  }
  if (type == "Whitespace") {
    std::string w = kWordClass;
    return std::make_unique<SplitPreTokenizer>(Regex("[" + w + "]+|[^" + w + R"(\p{White_Space}]+)", where), true,
                                               SplitBehavior::Removed);
  }
  if (type == "WhitespaceSplit") {
    return std::make_unique<SplitPreTokenizer>(Regex(R"(\p{White_Space})", where), false, SplitBehavior::Removed);
  }
  if (type == "CharDelimiterSplit") {
    std::string d = require_string(j, "delimiter", where);
    return std::make_unique<SplitPreTokenizer>(Regex(d, where, /*literal=*/true), false, SplitBehavior::Removed);
  }
  // Punctuation: ASCII punctuation or a Unicode P* character (HF is_punc).
  const char* kPunct = R"([\p{P}!-/:-@\[-`{-~])";
  if (type == "Punctuation") {
    std::string b = optional_string(j, "behavior", where).value_or("Isolated");
    return std::make_unique<SplitPreTokenizer>(Regex(kPunct, where), false,
                                               parse_split_behavior(b, field_path(where, "behavior")));
  }
  if (type == "BertPreTokenizer") {
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    parts.push_back(
        std::make_unique<SplitPreTokenizer>(Regex(R"(\p{White_Space})", where), false, SplitBehavior::Removed));
    parts.push_back(std::make_unique<SplitPreTokenizer>(Regex(kPunct, where), false, SplitBehavior::Isolated));
    return std::make_unique<SequencePreTokenizer>(std::move(parts));
  }
  LS_THROW
      << field_path(where, "type") << ": pre-tokenizer '" << excerpt(type)
      << "' is not supported (supported: ByteLevel, Split, Sequence, Digits, Whitespace, WhitespaceSplit, "
         "CharDelimiterSplit, Punctuation, BertPreTokenizer)";
}

}  // namespace lockstep::tokenizer
