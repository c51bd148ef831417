// Loading tokenizer.json / tokenizer_config.json and the encode/decode pipeline:
// added tokens -> normalizer -> normalized added tokens -> pre-tokenizer ->
// BPE, in the order and with the rules of Hugging Face `tokenizers`.
#include "lockstep/tokenizer/tokenizer.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>

#include "lockstep/base/excerpt.h"
#include "lockstep/base/file_util.h"
#include "lockstep/base/log.h"
#include "lockstep/tokenizer/byte_level.h"
#include "lockstep/tokenizer/scratch.h"
#include "lockstep/tokenizer/tokenizer_impl.h"
#include "lockstep/tokenizer/unicode.h"

namespace lockstep::tokenizer {
namespace {

std::string read_file(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) LS_THROW << absolute_path(path.string()) << ": cannot open";
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Assigns ids to the added tokens exactly as HF's AddedVocabulary does when it
// loads a file: a token already in the vocabulary keeps that id, others get
// the next id after the model vocabulary (the id written in the file is only
// checked). Identical duplicates and empty tokens are skipped.
void assign_added_tokens(Tokenizer::Impl& t, const Json& list, const std::string& where) {
  std::map<int32_t, AddedToken> by_id;
  std::vector<std::string> special_order, plain_order;  // contents, in the order HF keeps them
  std::vector<std::string> special_set;
  auto is_special_content = [&](const std::string& c) {
    return std::find(special_set.begin(), special_set.end(), c) != special_set.end();
  };
  for (size_t i = 0; i < list.size(); ++i) {
    std::string w = index_path(where, i);
    const Json& e = list[i];
    AddedToken tok;
    tok.content = require_string(e, "content", w);
    int64_t file_id = get_int(e, "id", w, -1);
    tok.special = get_bool(e, "special", w, false);
    tok.single_word = get_bool(e, "single_word", w, false);
    tok.lstrip = get_bool(e, "lstrip", w, false);
    tok.rstrip = get_bool(e, "rstrip", w, false);
    tok.normalized = get_bool(e, "normalized", w, !tok.special);
    if (tok.special && !tok.content.empty() && !is_special_content(tok.content)) {
      special_set.push_back(tok.content);
      special_order.push_back(tok.content);
    }
    if (tok.content.empty()) continue;
    bool duplicate = false;
    for (const auto& [id, other] : by_id) {
      AddedToken a = other, b = tok;
      a.id = b.id = 0;
      duplicate = duplicate || a == b;
    }
    if (duplicate) continue;
    int32_t id;
    if (auto it = t.added_ids.find(tok.content); it != t.added_ids.end()) {
      id = it->second;
    } else if (auto mid = t.model.token_to_id(tok.content)) {
      id = *mid;
    } else {
      auto base = static_cast<int32_t>(t.model.vocab_entries());
      if (by_id.empty()) {
        id = base;
      } else {
        int32_t mx = by_id.rbegin()->first;
        id = mx >= base ? mx + 1 : base;
      }
    }
    tok.id = id;
    t.added_ids[tok.content] = id;
    by_id[id] = tok;
    if (!is_special_content(tok.content)) plain_order.push_back(tok.content);
    if (file_id >= 0 && file_id != id) {
      LS_LOG(Warn) << w << ": token '" << tok.content << "' is listed with id " << file_id << " but gets id "
                   << id << " (as in Hugging Face tokenizers)";
    }
  }
  t.added.clear();
  for (const auto& [id, tok] : by_id) t.added.push_back(tok);
  std::sort(t.added.begin(), t.added.end(),
            [](const AddedToken& a, const AddedToken& b) { return a.id < b.id; });

  // Matchers: special tokens first, then the others, each with the flags of the
  // token finally registered under its id.
  std::vector<AddedToken> raw, norm;
  std::vector<std::string> raw_pat, norm_pat;
  auto add = [&](const std::string& content) {
    const AddedToken& tok = by_id.at(t.added_ids.at(content));
    if (tok.normalized) {
      std::string p = tok.content;
      if (t.normalizer) t.normalizer->apply(p);
      norm.push_back(tok);
      norm_pat.push_back(p);
    } else {
      raw.push_back(tok);
      raw_pat.push_back(tok.content);
    }
  };
  for (const auto& c : special_order) add(c);
  for (const auto& c : plain_order) add(c);
  t.raw_matcher.build(raw, raw_pat);
  t.normalized_matcher.build(norm, norm_pat);

  t.special.clear();
  for (const auto& c : special_set) {
    int32_t id = t.added_ids.at(c);
    if (static_cast<size_t>(id) >= t.special.size()) t.special.resize(static_cast<size_t>(id) + 1, 0);
    t.special[static_cast<size_t>(id)] = 1;
  }
}

// transformers' Llama-family fast tokenizers rebuild the post-processor from
// add_bos_token/add_eos_token (defaults true/false); other classes use the
// tokenizer.json post-processor as is.
bool uses_config_special_tokens(const TokenizerConfig& c) {
  return c.tokenizer_class.find("Llama") != std::string::npos ||
         c.tokenizer_class.find("Gemma") != std::string::npos;
}

std::shared_ptr<Tokenizer::Impl> build(const std::string& text, const std::string& origin,
                                       const std::optional<TokenizerConfig>& config,
                                       const TokenizerOptions& options) {
  Json j;
  try {
    j = Json::parse(text);
  } catch (const Json::exception& e) {  // parse_error, or out_of_range for 1e400
    LS_THROW << origin << ": invalid JSON: " << excerpt(e.what(), kJsonErrorBytes);
  }
  std::string where = origin + ":";
  if (!j.is_object()) LS_THROW << origin << ": expected a JSON object";
  if (auto v = optional_string(j, "version", where); v && *v != "1.0")
    LS_THROW << field_path(where, "version") << ": unknown tokenizer.json version '" << excerpt(*v)
             << "' (expected 1.0)";
  for (const char* ignored : {"truncation", "padding"}) {
    if (optional_field(j, ignored) != nullptr) {
      LS_LOG(Warn) << field_path(where, ignored)
                   << " is ignored (lockstep applies no truncation or padding when encoding)";
    }
  }
  auto t = std::make_shared<Tokenizer::Impl>(
      BpeModel::from_json(require_field(j, "model", where), field_path(where, "model")));
  t->origin = origin;
  static const Json kNull = nullptr;
  auto part = [&](const char* key) -> const Json& {
    const Json* p = optional_field(j, key);
    return p ? *p : kNull;
  };
  t->normalizer = make_normalizer(part("normalizer"), field_path(where, "normalizer"));
  t->pre_tokenizer = make_pre_tokenizer(part("pre_tokenizer"), field_path(where, "pre_tokenizer"));
  t->decoder = make_decoder(part("decoder"), field_path(where, "decoder"));
  t->post_processor = make_post_processor(part("post_processor"), field_path(where, "post_processor"));
  t->span_fast_path = t->pre_tokenizer && t->pre_tokenizer->supports_spans() &&
                      t->pre_tokenizer->ends_with_byte_level() && t->model.supports_raw_bytes();
  if (const Json* list = optional_field(j, "added_tokens")) {
    if (!list->is_array()) LS_THROW << field_path(where, "added_tokens") << ": expected an array";
    assign_added_tokens(*t, *list, field_path(where, "added_tokens"));
  }

  int32_t max_id = t->model.max_id();
  for (const auto& a : t->added) max_id = std::max(max_id, a.id);
  t->vocab_size = max_id + 1;
  auto n = static_cast<size_t>(t->vocab_size);
  t->token_text.assign(n, std::string());
  t->known.assign(n, 0);
  t->special.resize(n, 0);
  for (int32_t id = 0; id <= t->model.max_id(); ++id) {
    if (const std::string* s = t->model.id_to_token(id)) {
      t->token_text[static_cast<size_t>(id)] = *s;
      t->known[static_cast<size_t>(id)] = 1;
    }
  }
  // Added tokens win over the model's entry for the same id, as in HF's decode.
  for (const auto& a : t->added) {
    t->token_text[static_cast<size_t>(a.id)] = a.content;
    t->known[static_cast<size_t>(a.id)] = 1;
  }
  // HF skips by content: a token whose text is a special token's is skipped too.
  for (size_t id = 0; id < n; ++id) {
    if (!t->known[id] || t->special[id]) continue;
    if (auto it = t->added_ids.find(t->token_text[id]); it != t->added_ids.end())
      t->special[id] = t->special[static_cast<size_t>(it->second)];
  }
  // The ids a post-processor adds are plain numbers in the file: each must be
  // a token, or encode(add_special_tokens) would hand out ids the model has
  // no embedding row for.
  if (t->post_processor) {
    std::vector<int32_t> added_ids;
    t->post_processor->apply(added_ids);  // on no ids: exactly the ids it adds
    for (const int32_t id : added_ids)
      if (id < 0 || id >= t->vocab_size || !t->known[static_cast<size_t>(id)])
        LS_THROW << field_path(where, "post_processor") << ": adds token id " << id
                 << ", which is not in the vocabulary (" << t->vocab_size << " ids)";
  }
  if (t->decoder && t->decoder->decodes_byte_runs()) {
    t->byte_run_token.assign(n, 0);
    for (size_t id = 0; id < n; ++id) {
      const std::string& s = t->token_text[id];
      t->byte_run_token[id] = s.size() == 6 && s.compare(0, 3, "<0x") == 0 && s[5] == '>';
    }
  }
  if (t->decoder && t->decoder->is_byte_level()) {
    t->byte_level_bytes.assign(n, std::string());
    for (size_t id = 0; id < n; ++id) {
      const std::string& s = t->token_text[id];
      if (!byte_level_decode(s, t->byte_level_bytes[id])) t->byte_level_bytes[id] = s;
    }
  }

  if (config) t->config = *config;
  if (uses_config_special_tokens(t->config)) {
    std::vector<int32_t> prefix, suffix;
    auto id_of = [&](const std::optional<std::string>& tok, const char* what) -> std::optional<int32_t> {
      if (!tok) return std::nullopt;
      auto it = t->added_ids.find(*tok);
      if (it != t->added_ids.end()) return it->second;
      if (auto mid = t->model.token_to_id(*tok)) return *mid;
      LS_THROW << "tokenizer_config.json: " << what << " '" << excerpt(*tok) << "' is not a token of "
               << origin;
    };
    if (t->config.add_bos_token.value_or(true))
      if (auto id = id_of(t->config.bos_token, "bos_token")) prefix.push_back(*id);
    if (t->config.add_eos_token.value_or(false))
      if (auto id = id_of(t->config.eos_token, "eos_token")) suffix.push_back(*id);
    t->post_processor = make_wrap_post_processor(std::move(prefix), std::move(suffix));
  }

  if (!options.chat_template.empty() && options.chat_template != "auto") {
    t->chat = ChatTemplate::by_name(options.chat_template);
  } else if (t->config.chat_template) {
    t->chat = ChatTemplate::detect(*t->config.chat_template);
    if (!t->chat) {
      t->chat_error =
          "tokenizer_config.json: chat_template is not one of the built-in templates (chatml, llama3, "
          "deepseek); choose one explicitly (e.g. --chat-template chatml, or raw for plain text)";
    }
  } else {
    t->chat_error = origin +
                    ": no chat template (tokenizer_config.json has none); choose one of chatml, llama3, "
                    "deepseek, raw (e.g. --chat-template chatml)";
  }
  return t;
}

}  // namespace

Tokenizer Tokenizer::load(const std::filesystem::path& path, const TokenizerOptions& options) {
  std::filesystem::path dir, file;
  if (std::filesystem::is_directory(path)) {
    dir = path;
    file = path / "tokenizer.json";
  } else {
    file = path;
    dir = path.parent_path();
  }
  if (!std::filesystem::exists(file))
    LS_THROW << file.string() << ": not found (expected a Hugging Face tokenizer.json)";
  std::optional<TokenizerConfig> config;
  std::filesystem::path cfg = dir / "tokenizer_config.json";
  if (std::filesystem::exists(cfg)) config = TokenizerConfig::from_file(cfg);
  std::filesystem::path jinja = dir / "chat_template.jinja";
  if (std::filesystem::exists(jinja)) {
    if (!config) config = TokenizerConfig{};
    if (!config->chat_template) config->chat_template = read_file(jinja);
  }
  return Tokenizer(build(read_file(file), file.string(), config, options));
}

Tokenizer Tokenizer::from_json_text(const std::string& tokenizer_json, const std::string& origin,
                                    const std::optional<TokenizerConfig>& config,
                                    const TokenizerOptions& options) {
  return Tokenizer(build(tokenizer_json, origin, config, options));
}

void Tokenizer::Impl::encode_text(std::string_view text, std::vector<int32_t>& ids) const {
  if (text.empty()) return;
  if (span_fast_path) {
    thread_local std::vector<Span> spans;
    spans.clear();
    spans.push_back(Span{0, static_cast<uint32_t>(text.size())});
    pre_tokenizer->apply_spans(text, spans);
    for (const Span& sp : spans) model.encode_raw(text.substr(sp.begin, sp.end - sp.begin), ids);
    release_if_large(spans);
    return;
  }
  thread_local std::vector<std::string> pieces;
  // encode_text is not re-entered on one thread, so one scratch vector suffices.
  pieces.clear();
  pieces.emplace_back(text);
  if (pre_tokenizer) pre_tokenizer->apply(pieces);
  for (const auto& p : pieces) model.encode(p, ids);
  release_if_large(pieces);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  const Impl& m = *impl_;
  std::string repaired;
  std::string_view s = text;
  if (!utf8_is_valid(text)) {
    repaired = utf8_sanitize(text);
    s = repaired;
  }
  std::vector<int32_t> ids;
  ids.reserve(s.size() / 3 + 4);
  std::vector<TextPart> parts, inner;
  m.raw_matcher.split(s, parts);
  std::string normalized;
  for (const TextPart& p : parts) {
    if (p.token_id >= 0) {
      ids.push_back(p.token_id);
      continue;
    }
    std::string_view seg = s.substr(p.begin, p.end - p.begin);
    if (seg.empty()) continue;
    std::string_view t = seg;
    if (m.normalizer) {
      normalized.assign(seg);
      m.normalizer->apply(normalized);
      t = normalized;
    }
    if (m.normalized_matcher.empty()) {
      m.encode_text(t, ids);
      continue;
    }
    inner.clear();
    m.normalized_matcher.split(t, inner);
    for (const TextPart& q : inner) {
      if (q.token_id >= 0) {
        ids.push_back(q.token_id);
      } else {
        m.encode_text(t.substr(q.begin, q.end - q.begin), ids);
      }
    }
  }
  if (add_special_tokens && m.post_processor) m.post_processor->apply(ids);
  return ids;
}

std::string Tokenizer::Impl::decode_bytes(std::span<const int32_t> ids, bool skip_special) const {
  auto usable = [&](int32_t id) {
    if (id < 0 || id >= vocab_size || !known[static_cast<size_t>(id)]) return false;
    return !(skip_special && special[static_cast<size_t>(id)]);
  };
  std::string out;
  if (!byte_level_bytes.empty()) {
    for (int32_t id : ids)
      if (usable(id)) out += byte_level_bytes[static_cast<size_t>(id)];
    return out;
  }
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids)
    if (usable(id)) tokens.push_back(token_text[static_cast<size_t>(id)]);
  if (decoder) {
    decoder->apply(tokens);
    for (const auto& t : tokens) out += t;
  } else {
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i > 0) out.push_back(' ');
      out += tokens[i];
    }
  }
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  return utf8_sanitize(impl_->decode_bytes(ids, skip_special_tokens));
}

std::string Tokenizer::token_bytes(int32_t id) const {
  const int32_t one[1] = {id};
  return impl_->decode_bytes(std::span<const int32_t>(one, 1), false);
}

DecodeStream Tokenizer::decode_stream(bool skip_special_tokens) const {
  return DecodeStream(impl_, skip_special_tokens);
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (auto it = impl_->added_ids.find(token); it != impl_->added_ids.end()) return it->second;
  return impl_->model.token_to_id(token);
}

std::optional<std::string> Tokenizer::id_to_token(int32_t id) const {
  if (id < 0 || id >= impl_->vocab_size || !impl_->known[static_cast<size_t>(id)]) return std::nullopt;
  return impl_->token_text[static_cast<size_t>(id)];
}

int32_t Tokenizer::vocab_size() const {
  return impl_->vocab_size;
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < impl_->vocab_size && impl_->special[static_cast<size_t>(id)];
}

const std::vector<AddedToken>& Tokenizer::added_tokens() const {
  return impl_->added;
}

const TokenizerConfig& Tokenizer::config() const {
  return impl_->config;
}

std::optional<int32_t> Tokenizer::bos_id() const {
  return impl_->config.bos_token ? token_to_id(*impl_->config.bos_token) : std::nullopt;
}
std::optional<int32_t> Tokenizer::eos_id() const {
  return impl_->config.eos_token ? token_to_id(*impl_->config.eos_token) : std::nullopt;
}
std::optional<int32_t> Tokenizer::pad_id() const {
  return impl_->config.pad_token ? token_to_id(*impl_->config.pad_token) : std::nullopt;
}

const ChatTemplate& Tokenizer::chat_template() const {
  if (!impl_->chat) LS_THROW << impl_->chat_error;
  return *impl_->chat;
}

std::string Tokenizer::apply_chat_template(const std::vector<ChatMessage>& messages,
                                           bool add_generation_prompt) const {
  return chat_template().render(messages, add_generation_prompt, impl_->config.bos_token.value_or(""));
}

std::vector<int32_t> Tokenizer::encode_chat(const std::vector<ChatMessage>& messages,
                                            bool add_generation_prompt) const {
  const ChatTemplate& t = chat_template();
  std::string text = t.render(messages, add_generation_prompt, impl_->config.bos_token.value_or(""));
  return encode(text, t.format() == ChatFormat::Raw);
}

}  // namespace lockstep::tokenizer
