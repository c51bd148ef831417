// Implementations of the supported tokenizer.json normalizers. Each mirrors the
// Hugging Face `tokenizers` normalizer of the same name on the text (offsets,
// which lockstep does not track, are ignored).
#include "lockstep/tokenizer/normalizer.h"

#include <vector>

#include "lockstep/base/excerpt.h"
#include "lockstep/tokenizer/byte_level.h"
#include "lockstep/tokenizer/regex.h"
#include "lockstep/tokenizer/unicode.h"

namespace lockstep::tokenizer {
namespace {

class UnicodeForm : public Normalizer {
 public:
  explicit UnicodeForm(NormalForm f) : form_(f) {}
  void apply(std::string& s) const override { s = normalize(s, form_); }

 private:
  NormalForm form_;
};

class Lowercase : public Normalizer {
 public:
  void apply(std::string& s) const override { s = to_lowercase(s); }
};

class Strip : public Normalizer {
 public:
  Strip(bool left, bool right) : left_(left), right_(right) {}
  void apply(std::string& s) const override {
    size_t b = 0, e = s.size();
    if (left_) {
      while (b < e) {
        Utf8Step st = utf8_next(s, b);
        if (!is_white_space(st.cp)) break;
        b += st.len;
      }
    }
    if (right_) {
      while (e > b) {
        size_t k = e - 1;
        while (k > b && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
        if (!is_white_space(utf8_next(s, k).cp)) break;
        e = k;
      }
    }
    s = s.substr(b, e - b);
  }

 private:
  bool left_, right_;
};

class Prepend : public Normalizer {
 public:
  explicit Prepend(std::string p) : prefix_(std::move(p)) {}
  void apply(std::string& s) const override {
    if (!s.empty()) s.insert(0, prefix_);  // HF prepends only to non-empty text
  }

 private:
  std::string prefix_;
};

class Replace : public Normalizer {
 public:
  Replace(Regex re, std::string content) : re_(std::move(re)), content_(std::move(content)) {}
  void apply(std::string& s) const override {
    std::vector<Span> spans;
    re_.find_all(s, spans);
    if (spans.empty()) return;
    std::string out;
    out.reserve(s.size());
    size_t prev = 0;
    for (const Span& sp : spans) {
      out.append(s, prev, sp.begin - prev);
      out += content_;
      prev = sp.end;
    }
    out.append(s, prev, std::string::npos);
    s = std::move(out);
  }

 private:
  Regex re_;
  std::string content_;
};

class ByteLevelNormalizer : public Normalizer {
 public:
  void apply(std::string& s) const override {
    std::string out;
    byte_level_encode(s, out);
    s = std::move(out);
  }
};

class SequenceNormalizer : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> parts) : parts_(std::move(parts)) {}
  void apply(std::string& s) const override {
    for (const auto& p : parts_) p->apply(s);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

}  // namespace

// {"String": "..."} or {"Regex": "..."}, as used by Replace and Split.
Regex make_pattern(const Json& j, const std::string& where) {
  if (!j.is_object()) LS_THROW << where << ": expected {\"String\": ...} or {\"Regex\": ...}";
  if (auto s = optional_string(j, "String", where)) {
    // An empty string matches nowhere in HF (it would match everywhere in PCRE2).
    if (s->empty()) return Regex("(*FAIL)", where);
    return Regex(*s, where, /*literal=*/true);
  }
  if (auto r = optional_string(j, "Regex", where)) return Regex(*r, where);
  LS_THROW << where << ": expected {\"String\": ...} or {\"Regex\": ...}";
}

std::unique_ptr<Normalizer> make_normalizer(const Json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  std::string type = component_type(j, where);
  if (type == "NFC") return std::make_unique<UnicodeForm>(NormalForm::NFC);
  if (type == "NFD") return std::make_unique<UnicodeForm>(NormalForm::NFD);
  if (type == "NFKC") return std::make_unique<UnicodeForm>(NormalForm::NFKC);
  if (type == "NFKD") return std::make_unique<UnicodeForm>(NormalForm::NFKD);
  if (type == "Lowercase") return std::make_unique<Lowercase>();
  if (type == "Strip") {
    return std::make_unique<Strip>(get_bool(j, "strip_left", where, true), get_bool(j, "strip_right", where, true));
  }
  if (type == "Prepend") return std::make_unique<Prepend>(require_string(j, "prepend", where));
  if (type == "Replace") {
    return std::make_unique<Replace>(make_pattern(require_field(j, "pattern", where), field_path(where, "pattern")),
                                     require_string(j, "content", where));
  }
  if (type == "ByteLevel") return std::make_unique<ByteLevelNormalizer>();
  if (type == "Sequence") {
    const Json& list = require_array(j, "normalizers", where);
    std::vector<std::unique_ptr<Normalizer>> parts;
    for (size_t i = 0; i < list.size(); ++i) {
      auto p = make_normalizer(list[i], index_path(field_path(where, "normalizers"), i));
      if (p) parts.push_back(std::move(p));
    }
    if (parts.empty()) return nullptr;  // an empty Sequence (DeepSeek-V3) changes nothing
    return std::make_unique<SequenceNormalizer>(std::move(parts));
  }
  LS_THROW << field_path(where, "type") << ": normalizer '" << excerpt(type)
           << "' is not supported (supported: NFC, NFD, NFKC, NFKD, Lowercase, Strip, Prepend, Replace, "
              "ByteLevel, Sequence)";
}

}  // namespace lockstep::tokenizer
