// TemplateProcessing, Roberta/Bert processing, ByteLevel (no ids) and Sequence
// for single sequences; pair templates are not needed by lockstep.
#include "lockstep/tokenizer/post_processor.h"

#include "lockstep/base/excerpt.h"

namespace lockstep::tokenizer {
namespace {

class Wrap : public PostProcessor {
 public:
  Wrap(std::vector<int32_t> prefix, std::vector<int32_t> suffix) : prefix_(std::move(prefix)), suffix_(std::move(suffix)) {}
  void apply(std::vector<int32_t>& ids) const override {
    ids.insert(ids.begin(), prefix_.begin(), prefix_.end());
    ids.insert(ids.end(), suffix_.begin(), suffix_.end());
  }

 private:
  std::vector<int32_t> prefix_, suffix_;
};

// TemplateProcessing "single": a list of {"SpecialToken": {"id": name}} and
// {"Sequence": {"id": "A"}} pieces.
class Template : public PostProcessor {
 public:
  struct Piece {
    bool sequence;
    std::vector<int32_t> ids;
  };
  explicit Template(std::vector<Piece> pieces) : pieces_(std::move(pieces)) {}
  void apply(std::vector<int32_t>& ids) const override {
    std::vector<int32_t> out;
    out.reserve(ids.size() + 4);
    for (const Piece& p : pieces_) {
      if (p.sequence) {
        out.insert(out.end(), ids.begin(), ids.end());
      } else {
        out.insert(out.end(), p.ids.begin(), p.ids.end());
      }
    }
    ids.swap(out);
  }

 private:
  std::vector<Piece> pieces_;
};

class SequenceProcessor : public PostProcessor {
 public:
  explicit SequenceProcessor(std::vector<std::unique_ptr<PostProcessor>> parts) : parts_(std::move(parts)) {}
  void apply(std::vector<int32_t>& ids) const override {
    for (const auto& p : parts_) p->apply(ids);
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> parts_;
};

int32_t token_pair_id(const Json& j, const char* key, const std::string& where) {
  const Json& v = require_field(j, key, where);
  if (!v.is_array() || v.size() != 2 || !v[1].is_number_integer())
    LS_THROW << field_path(where, key) << ": expected [\"token\", id]";
  return v[1].get<int32_t>();
}

std::unique_ptr<PostProcessor> make_template(const Json& j, const std::string& where) {
  const Json& single = require_field(j, "single", where);
  std::string swhere = field_path(where, "single");
  if (!single.is_array()) {
    // The string form ("<s> $A </s>") is what the Python API accepts; files store the list.
    LS_THROW << swhere << ": expected the serialized list form of the template";
  }
  const Json* specials = optional_field(j, "special_tokens");
  std::vector<Template::Piece> pieces;
  for (size_t i = 0; i < single.size(); ++i) {
    std::string pw = index_path(swhere, i);
    const Json& p = single[i];
    if (const Json* seq = optional_field(p, "Sequence")) {
      std::string id = require_string(*seq, "id", pw + ".Sequence");
      if (id != "A") LS_THROW << pw << ".Sequence.id: a single-sequence template can only use A, got " << id;
      pieces.push_back({true, {}});
    } else if (const Json* sp = optional_field(p, "SpecialToken")) {
      std::string name = require_string(*sp, "id", pw + ".SpecialToken");
      if (specials == nullptr || !specials->contains(name))
        LS_THROW << field_path(where, "special_tokens") << ": no entry for '" << excerpt(name) << "'";
      const Json& entry = (*specials)[name];
      std::string ew = field_path(where, "special_tokens") + "." + name;
      const Json& ids = require_array(entry, "ids", ew);
      std::vector<int32_t> v;
      for (const Json& x : ids) {
        if (!x.is_number_integer()) LS_THROW << field_path(ew, "ids") << ": expected integers";
        v.push_back(x.get<int32_t>());
      }
      pieces.push_back({false, std::move(v)});
    } else {
      LS_THROW << pw << ": expected {\"Sequence\": ...} or {\"SpecialToken\": ...}";
    }
  }
  return std::make_unique<Template>(std::move(pieces));
}

}  // namespace

std::unique_ptr<PostProcessor> make_wrap_post_processor(std::vector<int32_t> prefix, std::vector<int32_t> suffix) {
  return std::make_unique<Wrap>(std::move(prefix), std::move(suffix));
}

std::unique_ptr<PostProcessor> make_post_processor(const Json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  std::string type = component_type(j, where);
  if (type == "ByteLevel") return nullptr;  // only trims offsets
  if (type == "TemplateProcessing") return make_template(j, where);
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    return std::make_unique<Wrap>(std::vector<int32_t>{token_pair_id(j, "cls", where)},
                                  std::vector<int32_t>{token_pair_id(j, "sep", where)});
  }
  if (type == "Sequence") {
    const Json& list = require_array(j, "processors", where);
    std::vector<std::unique_ptr<PostProcessor>> parts;
    for (size_t i = 0; i < list.size(); ++i) {
      auto p = make_post_processor(list[i], index_path(field_path(where, "processors"), i));
      if (p) parts.push_back(std::move(p));
    }
    if (parts.empty()) return nullptr;
    return std::make_unique<SequenceProcessor>(std::move(parts));
  }
  LS_THROW
      << field_path(where, "type") << ": post-processor '" << excerpt(type)
      << "' is not supported (supported: TemplateProcessing, ByteLevel, RobertaProcessing, BertProcessing, "
         "Sequence)";
}

}  // namespace lockstep::tokenizer
