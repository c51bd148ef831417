// Request parsing for the three generation APIs of `lockstep serve`. Every
// accepted key is listed here; anything else is a 400 naming the key, so a
// misspelt parameter never silently changes nothing.
#include "lockstep/serve/protocol.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>

#include "lockstep/base/error.h"
#include "lockstep/base/excerpt.h"
#include "lockstep/tokenizer/unicode.h"

namespace lockstep::serve {

using nlohmann::json;

json error_body(int status, const std::string& message, const std::string& type) {
  return json{{"error", {{"message", message}, {"type", type}, {"code", status}}}};
}

namespace {

// Deepest nesting of arrays and objects in `text` read as JSON (brackets in
// strings do not count); HttpError(400) on a NUL byte. Linear and
// allocation-free: it runs before the parser.
size_t json_nesting_depth(const std::string& text) {
  size_t depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    // nlohmann's parser takes a NUL byte for the end of the input and
    // would ignore whatever follows it; JSON has no place for one.
    if (c == '\0') throw HttpError(400, "invalid JSON: the body holds a NUL byte");
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

}  // namespace

json parse_json_body(const std::string& body) {
  if (body.empty()) throw HttpError(400, "the request body is empty (expected a JSON object)");
  // The deepest real request (chat content parts) nests 4 levels. Refusing
  // deeper bodies up front keeps every later walk over the value (copies,
  // dumps, comparisons, several of them recursive in nlohmann) shallow.
  if (const size_t depth = json_nesting_depth(body); depth > kMaxJsonDepth)
    throw HttpError(400, "invalid JSON: arrays and objects nest " + std::to_string(depth) +
                             " levels deep (at most " + std::to_string(kMaxJsonDepth) + ")");
  try {
    return json::parse(body);
  } catch (const json::exception& e) {
    // parse_error for bad syntax, out_of_range for a number past double's
    // range (1e999): both are the client's JSON.
    throw HttpError(400, "invalid JSON: " + excerpt(e.what(), kJsonErrorBytes));
  }
}

namespace {

[[noreturn]] void bad(const std::string& message) {
  throw HttpError(400, message);
}

// The keys of one JSON object, read with type checks. A JSON null counts as
// absent (OpenAI clients send "stop": null and the like). finish() rejects
// every key that no getter asked for.
class Fields {
 public:
  Fields(const json& obj, std::string where) : obj_(obj), where_(std::move(where)) {
    if (!obj_.is_object())
      bad(where_.empty() ? "the request body must be a JSON object" : where_ + " must be an object");
  }

  const json* get(const std::string& key) {
    known_.insert(key);
    auto it = obj_.find(key);
    if (it == obj_.end() || it->is_null()) return nullptr;
    return &*it;
  }
  bool has(const std::string& key) { return get(key) != nullptr; }

  bool get_bool(const std::string& key, bool fallback) {
    const json* v = get(key);
    if (!v) return fallback;
    if (!v->is_boolean()) bad(name(key) + " must be a boolean");
    return v->get<bool>();
  }
  double get_number(const std::string& key, double fallback) {
    const json* v = get(key);
    if (!v) return fallback;
    if (!v->is_number()) bad(name(key) + " must be a number");
    double d = v->get<double>();
    if (!std::isfinite(d)) bad(name(key) + " must be finite");
    // Every number parameter is used as a float: one past float's range would
    // become inf and be reported as such, not as what the client sent.
    if (std::fabs(d) > double(std::numeric_limits<float>::max()))
      bad(name(key) + " is out of range, got " + fmt(d));
    return d;
  }
  int64_t get_int(const std::string& key, int64_t fallback) {
    const json* v = get(key);
    if (!v) return fallback;
    return as_int(*v, name(key));
  }
  std::string get_string(const std::string& key, const std::string& fallback) {
    const json* v = get(key);
    if (!v) return fallback;
    if (!v->is_string()) bad(name(key) + " must be a string");
    return v->get<std::string>();
  }
  // Accepted only with its neutral value: a parameter lockstep does not
  // implement but that clients routinely send with defaults.
  void neutral_number(const std::string& key, double neutral) {
    double v = get_number(key, neutral);
    if (v != neutral) bad(name(key) + " is not supported (only " + fmt(neutral) + ")");
  }

  // Keys come from the client: an unknown one is quoted as an excerpt.
  std::string name(const std::string& key) const {
    const std::string k = excerpt(key);
    return where_.empty() ? k : where_ + "." + k;
  }

  void finish() const {
    for (auto it = obj_.begin(); it != obj_.end(); ++it) {
      if (known_.count(it.key())) continue;
      std::string accepted;
      for (const auto& k : known_) accepted += (accepted.empty() ? "" : ", ") + k;
      bad("unknown parameter " + name(it.key()) + " (accepted: " + accepted + ")");
    }
  }

  static int64_t as_int(const json& v, const std::string& what) {
    if (v.is_number_integer()) return v.get<int64_t>();
    if (v.is_number_float()) {
      double d = v.get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e15) return int64_t(d);
    }
    bad(what + " must be an integer");
  }
  static std::string fmt(double d) {
    std::ostringstream os;
    os << d;
    return os.str();
  }

 private:
  const json& obj_;
  std::string where_;
  std::set<std::string> known_;
};

std::vector<int32_t> parse_ids(const json& v, const std::string& what, const ModelLimits& lim) {
  if (!v.is_array()) bad(what + " must be a list of token ids");
  std::vector<int32_t> ids;
  ids.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string w = what + "[" + std::to_string(i) + "]";
    int64_t id = Fields::as_int(v[i], w);
    if (id < 0 || id >= lim.vocab_size)
      bad(w + ": token id " + std::to_string(id) + " is out of range [0, " + std::to_string(lim.vocab_size) +
          ")");
    ids.push_back(int32_t(id));
  }
  return ids;
}

const tokenizer::Tokenizer& need_tokenizer(const tokenizer::Tokenizer* tok, const std::string& what) {
  if (!tok) bad(what + " needs a tokenizer, but the model directory has no tokenizer.json; send token ids");
  return *tok;
}

std::vector<std::string> parse_stop(const json* v, const std::string& what) {
  std::vector<std::string> out;
  if (!v) return out;
  if (v->is_string()) {
    out.push_back(v->get<std::string>());
  } else if (v->is_array()) {
    for (const auto& s : *v) {
      if (!s.is_string()) bad(what + " must be a string or a list of strings");
      out.push_back(s.get<std::string>());
    }
  } else {
    bad(what + " must be a string or a list of strings");
  }
  for (const auto& s : out)
    if (s.empty()) bad(what + " must not contain an empty string");
  if (out.size() > 32) bad(what + ": at most 32 stop strings");
  return out;
}

std::vector<int32_t> parse_stop_ids(const json* v, const std::string& what, const ModelLimits& lim) {
  if (!v) return {};
  return parse_ids(*v, what, lim);
}

// Checks the prompts against the context and fills in or checks
// max_new_tokens: an explicit value that does not fit is an error (as in
// SGLang and vLLM); a default is shortened to what fits.
void check_lengths(GenJob& job, const ModelLimits& lim, bool explicit_max) {
  const int64_t samples = int64_t(job.prompts.size()) * std::max<int64_t>(job.params.n, 1);
  if (samples > lim.max_samples)
    bad(std::to_string(job.prompts.size()) + " prompts x " +
        (job.api == Api::Generate ? "sampling_params.n" : "n") + " " + std::to_string(job.params.n) + " = " +
        std::to_string(samples) + " samples; at most " + std::to_string(lim.max_samples) +
        " per request (--max-samples): split the batch");
  size_t longest = 0;
  for (size_t i = 0; i < job.prompts.size(); ++i) {
    const auto& p = job.prompts[i];
    if (p.empty()) bad("prompt " + std::to_string(i) + " is empty");
    if (int64_t(p.size()) >= lim.context)
      bad("prompt " + std::to_string(i) + " has " + std::to_string(p.size()) +
          " tokens; the model's context is " + std::to_string(lim.context) +
          " tokens (max_position_embeddings), which leaves no room to generate");
    longest = std::max(longest, p.size());
  }
  const int64_t room = lim.context - int64_t(longest);
  if (job.params.max_new_tokens > room) {
    if (explicit_max)
      bad("prompt (" + std::to_string(longest) + " tokens) + max new tokens (" +
          std::to_string(job.params.max_new_tokens) + ") exceed the model's context of " +
          std::to_string(lim.context) + " tokens");
    job.params.max_new_tokens = room;
  }
}

// SamplingParams::validate names SGLang's fields (sampling_params.X); the
// OpenAI APIs have them at the top level.
void validate_params(const GenJob& job) {
  try {
    job.params.validate();
  } catch (const Error& e) {
    std::string m = e.what();
    if (job.api != Api::Generate) {
      // OpenAI's names: top level, and max_tokens / min_tokens for SGLang's
      // max_new_tokens / min_new_tokens.
      const std::pair<std::string, std::string> renames[] = {
          {"sampling_params.", ""}, {"max_new_tokens", "max_tokens"}, {"min_new_tokens", "min_tokens"}};
      for (const auto& [from, to] : renames)
        for (size_t at = 0; (at = m.find(from, at)) != std::string::npos; at += to.size())
          m.replace(at, from.size(), to);
    }
    bad(m);
  }
}

// OpenAI's logit_bias: {"token id": bias}, each id in [0, vocab), each bias
// a number in [-100, 100] (the range itself is checked by validate()).
std::vector<std::pair<int32_t, float>> parse_logit_bias(const json& v, const std::string& what,
                                                        const ModelLimits& lim) {
  if (!v.is_object()) bad(what + " must be an object mapping token ids (strings) to numbers");
  std::vector<std::pair<int32_t, float>> out;
  for (auto it = v.begin(); it != v.end(); ++it) {
    const std::string& key = it.key();
    const std::string w = what + "[\"" + key + "\"]";
    size_t used = 0;
    long long id = -1;
    try {
      id = std::stoll(key, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (key.empty() || used != key.size() || !std::isdigit(static_cast<unsigned char>(key[0])))
      bad(what + ": key \"" + key + "\" is not a token id (a decimal integer)");
    if (id >= lim.vocab_size)
      bad(w + ": token id " + key + " is out of range [0, " + std::to_string(lim.vocab_size) + ")");
    if (!it->is_number()) bad(w + " must be a number");
    const double b = it->get<double>();
    if (!(b >= -100.0 && b <= 100.0)) bad(w + " must be in [-100, 100], got " + Fields::fmt(b));
    out.emplace_back(int32_t(id), float(b));
  }
  return out;
}

// A count of top alternatives: an integer in [0, kMaxTopLogprobs].
int64_t parse_top_count(Fields& f, const std::string& key) {
  const int64_t k = f.get_int(key, 0);
  if (k < 0 || k > rollout::kMaxTopLogprobs)
    bad(f.name(key) + " must be in [0, " + std::to_string(rollout::kMaxTopLogprobs) + "], got " +
        std::to_string(k));
  return k;
}

// The penalties, shared by every API (SGLang's sampling_params and the
// OpenAI body spell them alike; min_new_tokens is vLLM's min_tokens there).
void parse_penalties(Fields& f, rollout::SamplingParams& p, const std::string& min_key,
                     const ModelLimits& lim) {
  p.frequency_penalty = float(f.get_number("frequency_penalty", 0.0));
  p.presence_penalty = float(f.get_number("presence_penalty", 0.0));
  p.repetition_penalty = float(f.get_number("repetition_penalty", 1.0));
  p.min_new_tokens = f.get_int(min_key, 0);
  if (p.min_new_tokens < 0) bad(f.name(min_key) + " must be >= 0, got " + std::to_string(p.min_new_tokens));
  if (const json* lb = f.get("logit_bias")) p.logit_bias = parse_logit_bias(*lb, f.name("logit_bias"), lim);
}

// Sampling keys shared by the OpenAI APIs (with vLLM's extensions that
// RL clients use: top_k, min_p, ignore_eos, stop_token_ids, ...).
void parse_openai_sampling(Fields& f, GenJob& job, const ModelLimits& lim) {
  auto& p = job.params;
  job.model = f.get_string("model", lim.served_name);
  p.temperature = float(f.get_number("temperature", 1.0));
  p.top_p = float(f.get_number("top_p", 1.0));
  p.top_k = f.get_int("top_k", 0);
  p.min_p = float(f.get_number("min_p", 0.0));
  p.n = f.get_int("n", 1);
  p.seed = f.get_int("seed", -1);
  if (p.seed < -1) bad("seed must be >= 0");
  p.stop = parse_stop(f.get("stop"), "stop");
  p.stop_token_ids = parse_stop_ids(f.get("stop_token_ids"), "stop_token_ids", lim);
  p.ignore_eos = f.get_bool("ignore_eos", false);
  job.skip_special_tokens = f.get_bool("skip_special_tokens", true);
  job.stream = f.get_bool("stream", false);
  if (const json* so = f.get("stream_options")) {
    Fields s(*so, "stream_options");
    job.include_usage = s.get_bool("include_usage", false);
    s.get_bool("continuous_usage_stats", false);
    s.finish();
  }
  parse_penalties(f, p, "min_tokens", lim);
  f.neutral_number("best_of", double(p.n));
  f.get_string("user", "");
}

}  // namespace

GenJob parse_generate(const json& body, const tokenizer::Tokenizer* tok, const ModelLimits& lim) {
  GenJob job;
  job.api = Api::Generate;
  Fields f(body, "");
  const json* text = f.get("text");
  const json* ids = f.get("input_ids");
  if (text && ids) bad("give either text or input_ids, not both");
  if (!text && !ids) bad("missing text or input_ids");
  if (text) {
    const auto& t = need_tokenizer(tok, "text");
    // As SGLang: tokenizer(text) with the tokenizer's special tokens (BOS).
    if (text->is_string()) {
      job.prompts.push_back(t.encode(text->get<std::string>(), true));
    } else if (text->is_array()) {
      job.batched = true;
      for (size_t i = 0; i < text->size(); ++i) {
        if (!(*text)[i].is_string()) bad("text[" + std::to_string(i) + "] must be a string");
        job.prompts.push_back(t.encode((*text)[i].get<std::string>(), true));
      }
    } else {
      bad("text must be a string or a list of strings");
    }
  } else {
    if (!ids->is_array()) bad("input_ids must be a list of token ids or a list of such lists");
    if (!ids->empty() && (*ids)[0].is_array()) {
      job.batched = true;
      for (size_t i = 0; i < ids->size(); ++i)
        job.prompts.push_back(parse_ids((*ids)[i], "input_ids[" + std::to_string(i) + "]", lim));
    } else {
      job.prompts.push_back(parse_ids(*ids, "input_ids", lim));
    }
  }
  if (job.prompts.empty()) bad(std::string(text ? "text" : "input_ids") + " is an empty list (no prompt)");
  if (job.prompts.size() > 4096) bad("at most 4096 prompts per request");

  bool explicit_max = false;
  job.params.max_new_tokens = 128;  // SGLang's default
  if (const json* sp = f.get("sampling_params")) {
    if (sp->is_array()) bad("sampling_params must be one object (shared by every prompt of a batch)");
    Fields s(*sp, "sampling_params");
    auto& p = job.params;
    if (s.has("max_new_tokens")) {
      explicit_max = true;
      p.max_new_tokens = s.get_int("max_new_tokens", 128);
    }
    p.temperature = float(s.get_number("temperature", 1.0));
    p.top_p = float(s.get_number("top_p", 1.0));
    p.top_k = s.get_int("top_k", -1);
    p.min_p = float(s.get_number("min_p", 0.0));
    p.n = s.get_int("n", 1);
    if (s.has("seed") && s.has("sampling_seed")) bad("give sampling_params.seed or sampling_seed, not both");
    const std::string seed_key = s.has("sampling_seed") ? "sampling_seed" : "seed";
    p.seed = s.get_int("seed", s.get_int("sampling_seed", -1));
    if (p.seed < -1) bad(s.name(seed_key) + " must be >= 0");
    p.stop = parse_stop(s.get("stop"), "sampling_params.stop");
    p.stop_token_ids = parse_stop_ids(s.get("stop_token_ids"), "sampling_params.stop_token_ids", lim);
    p.ignore_eos = s.get_bool("ignore_eos", false);
    job.skip_special_tokens = s.get_bool("skip_special_tokens", true);
    job.no_stop_trim = s.get_bool("no_stop_trim", false);
    // Our decode never inserts spaces around special tokens; both values are accepted.
    s.get_bool("spaces_between_special_tokens", true);
    parse_penalties(s, p, "min_new_tokens", lim);
    s.finish();
  }
  job.params.return_logprobs = true;  // the engine always computes them; cheap
  job.return_logprob = f.get_bool("return_logprob", false);
  job.logprob_text = f.get_bool("return_text_in_logprobs", false);
  job.params.top_logprobs = parse_top_count(f, "top_logprobs_num");
  if (job.params.top_logprobs > 0 && !job.return_logprob) bad("top_logprobs_num needs return_logprob: true");
  job.logprob_start = f.get_int("logprob_start_len", -1);
  if (job.logprob_start < -1) bad("logprob_start_len must be >= 0 (or -1: output tokens only)");
  if (job.logprob_start >= 0 && !job.return_logprob) bad("logprob_start_len needs return_logprob: true");
  job.stream = f.get_bool("stream", false);
  job.return_experts = f.get_bool("return_routed_experts", false);
  job.return_indexer = f.get_bool("return_indexer_topk", false);
  job.rid = f.get_string("rid", "");
  f.finish();
  if (!job.params.stop.empty()) need_tokenizer(tok, "sampling_params.stop");
  check_lengths(job, lim, explicit_max);
  for (size_t i = 0; i < job.prompts.size(); ++i)
    if (job.logprob_start >= int64_t(job.prompts[i].size()))
      bad("logprob_start_len (" + std::to_string(job.logprob_start) +
          ") must be less than the length of prompt " + std::to_string(i) + " (" +
          std::to_string(job.prompts[i].size()) + " tokens)");
  validate_params(job);
  return job;
}

GenJob parse_completions(const json& body, const tokenizer::Tokenizer* tok, const ModelLimits& lim) {
  GenJob job;
  job.api = Api::Completions;
  Fields f(body, "");
  const json* prompt = f.get("prompt");
  if (!prompt) bad("missing prompt");
  // prompt: a string, a list of strings, a list of ids or a list of id lists.
  if (prompt->is_string()) {
    job.prompts.push_back(need_tokenizer(tok, "prompt").encode(prompt->get<std::string>(), true));
  } else if (prompt->is_array() && !prompt->empty()) {
    const json& first = (*prompt)[0];
    if (first.is_number()) {
      job.prompts.push_back(parse_ids(*prompt, "prompt", lim));
    } else {
      for (size_t i = 0; i < prompt->size(); ++i) {
        const json& p = (*prompt)[i];
        const std::string w = "prompt[" + std::to_string(i) + "]";
        if (p.is_string())
          job.prompts.push_back(need_tokenizer(tok, w).encode(p.get<std::string>(), true));
        else if (p.is_array())
          job.prompts.push_back(parse_ids(p, w, lim));
        else
          bad(w + " must be a string or a list of token ids");
      }
    }
  } else {
    bad("prompt must be a string, a list of strings, a list of token ids or a list of such lists");
  }
  if (job.prompts.size() > 4096) bad("at most 4096 prompts per request");
  parse_openai_sampling(f, job, lim);
  bool explicit_max = f.has("max_tokens");
  job.params.max_new_tokens = f.get_int("max_tokens", 16);  // OpenAI's default for completions
  if (f.has("logprobs")) {
    job.params.top_logprobs = parse_top_count(f, "logprobs");
    job.return_logprob = true;
  }
  // echo: the prompt's text before the completion's, and with logprobs its tokens' too.
  job.echo = f.get_bool("echo", false);
  if (job.echo && job.return_logprob) job.logprob_start = 0;
  if (job.echo && job.stream && job.return_logprob)
    bad("echo with logprobs is not supported with stream (the prompt's logprobs come with the full answer)");
  if (f.has("suffix")) bad("suffix is not supported");
  job.tokens_as_ids = f.get_bool("return_tokens_as_token_ids", false);  // vLLM's
  f.finish();
  if (!job.params.stop.empty()) need_tokenizer(tok, "stop");
  check_lengths(job, lim, explicit_max);
  validate_params(job);
  return job;
}

GenJob parse_chat(const json& body, const tokenizer::Tokenizer* tok, const ModelLimits& lim) {
  GenJob job;
  job.api = Api::Chat;
  Fields f(body, "");
  const json* messages = f.get("messages");
  if (!messages) bad("missing messages");
  if (!messages->is_array() || messages->empty()) bad("messages must be a non-empty list");
  std::vector<tokenizer::ChatMessage> chat;
  for (size_t i = 0; i < messages->size(); ++i) {
    const std::string w = "messages[" + std::to_string(i) + "]";
    Fields m((*messages)[i], w);
    tokenizer::ChatMessage cm;
    cm.role = m.get_string("role", "");
    if (cm.role.empty()) bad(w + ".role is missing");
    if (const json* c = m.get("content")) {
      if (c->is_string()) {
        cm.content = c->get<std::string>();
      } else if (c->is_array()) {
        // Content parts: only text parts, concatenated.
        for (size_t j = 0; j < c->size(); ++j) {
          Fields part((*c)[j], w + ".content[" + std::to_string(j) + "]");
          std::string type = part.get_string("type", "");
          if (type != "text") bad(part.name("type") + ": only \"text\" content parts are supported");
          cm.content += part.get_string("text", "");
          part.finish();
        }
      } else {
        bad(w + ".content must be a string or a list of content parts");
      }
    }
    m.get_string("name", "");
    m.finish();
    chat.push_back(std::move(cm));
  }
  parse_openai_sampling(f, job, lim);
  job.return_logprob = f.get_bool("logprobs", false);
  job.params.top_logprobs = parse_top_count(f, "top_logprobs");
  if (job.params.top_logprobs > 0 && !job.return_logprob) bad("top_logprobs needs logprobs: true");
  const bool add_generation_prompt = f.get_bool("add_generation_prompt", true);
  const auto& t = need_tokenizer(tok, "messages");
  try {
    job.prompts.push_back(t.encode_chat(chat, add_generation_prompt));
  } catch (const Error& e) {
    bad(std::string("chat template: ") + e.what());
  }
  bool explicit_max = f.has("max_tokens") || f.has("max_completion_tokens");
  if (f.has("max_tokens") && f.has("max_completion_tokens"))
    bad("give max_tokens or max_completion_tokens, not both");
  // Without a limit a chat answer may use the rest of the context (as vLLM).
  job.params.max_new_tokens = f.get_int("max_tokens", f.get_int("max_completion_tokens", lim.context));
  if (const json* tools = f.get("tools"))
    if (!tools->is_array() || !tools->empty()) bad("tools are not supported");
  f.get_string("tool_choice", "none");
  if (const json* rf = f.get("response_format")) {
    Fields r(*rf, "response_format");
    if (r.get_string("type", "text") != "text")
      bad("response_format: only {\"type\": \"text\"} is supported");
    r.finish();
  }
  job.tokens_as_ids = f.get_bool("return_tokens_as_token_ids", false);  // vLLM's
  f.finish();
  check_lengths(job, lim, explicit_max);
  validate_params(job);
  return job;
}

size_t find_stop(const std::string& text, const std::vector<std::string>& stops, std::string* matched) {
  size_t best = std::string::npos;
  for (const auto& s : stops) {
    size_t pos = text.find(s);
    if (pos != std::string::npos && (best == std::string::npos || pos < best)) {
      best = pos;
      if (matched) *matched = s;
    }
  }
  return best;
}

size_t stop_holdback(const std::string& text, const std::vector<std::string>& stops) {
  size_t hold = 0;
  for (const auto& s : stops) {
    for (size_t k = std::min(s.size() - 1, text.size()); k > hold; --k) {
      if (text.compare(text.size() - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
    }
  }
  return hold;
}

std::function<int64_t(const std::vector<int32_t>&)> make_stop_checker(const tokenizer::Tokenizer& tok,
                                                                      std::vector<std::string> stops,
                                                                      bool skip_special_tokens) {
  size_t longest = 0;
  for (const auto& s : stops) longest = std::max(longest, s.size());
  // The checker runs after every token, so a new match ends in the newest
  // token's text and starts within the last `longest` bytes. A window of
  // trailing tokens suffices once its text is that long plus slack for the
  // U+FFFD that a character cut at the window start decodes to (at most 3
  // bytes each for at most 3 bytes). Skipped special tokens decode to nothing,
  // hence the window grows until the text is long enough.
  const size_t need_bytes = longest + 12;
  return [tok, stops = std::move(stops), skip_special_tokens, longest,
          need_bytes](const std::vector<int32_t>& ids) -> int64_t {
    const size_t n = ids.size();
    size_t window = longest + 4, start = 0;
    std::string text;
    for (;;) {
      start = n > window ? n - window : 0;
      text = tok.decode(std::span<const int32_t>(ids.data() + start, n - start), skip_special_tokens);
      if (start == 0 || text.size() >= need_bytes) break;
      window *= 2;
    }
    if (find_stop(text, stops) == std::string::npos) return -1;
    // Normally the match completes at the last token; should an earlier prefix
    // already hold one, cut there.
    std::span<const int32_t> tail(ids.data() + start, n - start);
    for (size_t k = 1; k < tail.size(); ++k)
      if (find_stop(tok.decode(tail.first(k), skip_special_tokens), stops) != std::string::npos)
        return int64_t(start + k);
    return int64_t(n);
  };
}

SampleOutput finish_sample(const tokenizer::Tokenizer* tok, const GenJob& job, const rollout::SampleResult& s,
                           const std::vector<int32_t>& eos_ids) {
  SampleOutput out;
  if (tok) out.text = tok->decode(s.output_ids, job.skip_special_tokens);
  const int64_t n = int64_t(s.output_ids.size());
  if (s.finish_reason == "stop") {
    out.openai_finish = "stop";
    out.finish_reason = {{"type", "stop"}, {"matched", nullptr}};
    auto contains = [](const std::vector<int32_t>& v, int32_t x) {
      return std::find(v.begin(), v.end(), x) != v.end();
    };
    const int32_t last = s.output_ids.empty() ? -1 : s.output_ids.back();
    std::string matched;
    if (last >= 0 &&
        (contains(job.params.stop_token_ids, last) || (!job.params.ignore_eos && contains(eos_ids, last)))) {
      out.finish_reason["matched"] = last;
    } else if (size_t pos = find_stop(out.text, job.params.stop, &matched); pos != std::string::npos) {
      out.finish_reason["matched"] = matched;
      if (!job.no_stop_trim) out.text.resize(pos);
    }
  } else if (s.finish_reason == "length") {
    out.openai_finish = "length";
    out.finish_reason = {{"type", "length"}, {"length", n}};
  } else {
    out.openai_finish = "abort";
    out.finish_reason = {
        {"type", "abort"},
        {"message", "request aborted (server shutting down, client gone or weights updated)"}};
  }
  return out;
}

std::string token_text(const tokenizer::Tokenizer* tok, int32_t id) {
  if (!tok) return "";
  const int32_t one[1] = {id};
  return tok->decode(std::span<const int32_t>(one, 1), false);
}

namespace {
// A logprob as JSON: NaN (a prompt's first token has none) is null.
json lp_json(float lp) {
  return std::isnan(lp) ? json(nullptr) : json(lp);
}

json utf8_bytes(const std::string& t) {
  json bytes = json::array();
  for (unsigned char c : t) bytes.push_back(int(c));
  return bytes;
}
}  // namespace

json sglang_logprobs(const tokenizer::Tokenizer* tok, const std::vector<int32_t>& ids,
                     const std::vector<float>& logprobs, bool with_text) {
  json out = json::array();
  for (size_t i = 0; i < ids.size(); ++i) {
    json text = with_text ? json(token_text(tok, ids[i])) : json(nullptr);
    out.push_back(json::array({i < logprobs.size() ? lp_json(logprobs[i]) : json(0.0f), ids[i], text}));
  }
  return out;
}

json sglang_top_logprobs(const tokenizer::Tokenizer* tok, const std::vector<rollout::TopLogprobs>& top,
                         bool with_text, bool empty_is_null) {
  json out = json::array();
  for (const auto& pos : top) {
    if (pos.empty() && empty_is_null) {
      out.push_back(nullptr);
      continue;
    }
    json alts = json::array();
    for (const auto& [id, lp] : pos)
      alts.push_back(json::array({lp, id, with_text ? json(token_text(tok, id)) : json(nullptr)}));
    out.push_back(std::move(alts));
  }
  return out;
}

std::string token_key(const tokenizer::Tokenizer* tok, int32_t id, bool as_ids) {
  if (as_ids || !tok) return "token_id:" + std::to_string(id);
  const std::string b = tok->token_bytes(id);
  if (tokenizer::utf8_is_valid(b)) return token_text(tok, id);
  std::string key = "bytes:";
  for (unsigned char c : b) {
    constexpr char kHex[] = "0123456789abcdef";
    key += "\\x";
    key += kHex[c >> 4];
    key += kHex[c & 15];
  }
  return key;
}

namespace {

// One position's {key: logprob}, most likely first; as OpenAI, the sampled
// token is always there (up to N + 1 entries). A key already taken by another
// token (two tokens of the same text, e.g. an added token and a plain one)
// becomes "token_id:N" for the later, less likely one. Returns the sampled
// token's key.
std::string top_dict(const tokenizer::Tokenizer* tok, const rollout::TopLogprobs& alts, int32_t sampled,
                     float lp, bool as_ids, json* d) {
  std::map<std::string, int32_t> owner;
  std::string sampled_key;
  auto add = [&](int32_t id, const json& v) {
    std::string k = token_key(tok, id, as_ids);
    if (auto it = owner.find(k); it != owner.end() && it->second != id) k = "token_id:" + std::to_string(id);
    if (owner.emplace(k, id).second) (*d)[k] = v;
    if (id == sampled) sampled_key = k;
  };
  for (const auto& [id, alp] : alts) add(id, alp);
  if (sampled_key.empty()) add(sampled, lp_json(lp));
  return sampled_key;
}

}  // namespace

json completions_logprobs(const tokenizer::Tokenizer* tok, const std::vector<int32_t>& ids,
                          const std::vector<float>& logprobs, size_t first_text_offset,
                          const std::vector<rollout::TopLogprobs>* top, bool tokens_as_ids) {
  json tokens = json::array(), lps = json::array(), offsets = json::array();
  json tops = top ? json::array() : json(nullptr);
  size_t offset = first_text_offset;
  for (size_t i = 0; i < ids.size(); ++i) {
    const float lp = i < logprobs.size() ? logprobs[i] : 0.0f;
    std::string key = token_key(tok, ids[i], tokens_as_ids);
    lps.push_back(lp_json(lp));
    offsets.push_back(offset);
    offset += token_text(tok, ids[i]).size();  // offsets count the text's bytes
    const rollout::TopLogprobs none;
    const rollout::TopLogprobs& alts = top && i < top->size() ? (*top)[i] : none;
    if (!top) {
    } else if (alts.empty() && std::isnan(lp)) {
      tops.push_back(nullptr);  // the prompt's first token
    } else {
      json d = json::object();
      key = top_dict(tok, alts, ids[i], lp, tokens_as_ids, &d);  // tokens[i] is its key in the dict
      tops.push_back(std::move(d));
    }
    tokens.push_back(key);
  }
  return json{{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

json chat_logprobs(const tokenizer::Tokenizer* tok, const std::vector<int32_t>& ids,
                   const std::vector<float>& logprobs, const std::vector<rollout::TopLogprobs>* top,
                   bool tokens_as_ids) {
  // `bytes`: the token's own bytes (a part of a character is not U+FFFD's).
  auto bytes_of = [&](int32_t id) { return utf8_bytes(tok ? tok->token_bytes(id) : std::string()); };
  json content = json::array();
  for (size_t i = 0; i < ids.size(); ++i) {
    json alts = json::array();
    if (top && i < top->size())
      for (const auto& [id, lp] : (*top)[i])
        alts.push_back(
            {{"token", token_key(tok, id, tokens_as_ids)}, {"logprob", lp}, {"bytes", bytes_of(id)}});
    content.push_back({{"token", token_key(tok, ids[i], tokens_as_ids)},
                       {"logprob", i < logprobs.size() ? logprobs[i] : 0.0f},
                       {"bytes", bytes_of(ids[i])},
                       {"top_logprobs", alts}});
  }
  return json{{"content", content}};
}

json generate_item(const GenJob& job, const rollout::RequestResult& r, size_t sample, const SampleOutput& out,
                   const tokenizer::Tokenizer* tok, const std::string& id) {
  const auto& s = r.samples[sample];
  json meta = {{"id", id},
               {"finish_reason", out.finish_reason},
               {"prompt_tokens", r.prompt_ids.size()},
               {"completion_tokens", s.output_ids.size()},
               {"weight_version", s.weight_version},
               {"weight_version_end", s.weight_version_end},
               {"e2e_latency", s.latency_s},
               {"ttft", s.ttft_s}};
  if (job.return_logprob) {
    meta["output_token_logprobs"] = sglang_logprobs(tok, s.output_ids, s.logprobs, job.logprob_text);
    if (job.params.top_logprobs > 0)
      meta["output_top_logprobs"] = sglang_top_logprobs(tok, s.top_logprobs, job.logprob_text, false);
    if (r.prompt_logprob_start >= 0) {
      const std::vector<int32_t> ids(r.prompt_ids.begin() + r.prompt_logprob_start, r.prompt_ids.end());
      meta["input_token_logprobs"] = sglang_logprobs(tok, ids, r.prompt_logprobs, job.logprob_text);
      if (job.params.top_logprobs > 0)
        meta["input_top_logprobs"] = sglang_top_logprobs(tok, r.prompt_top_logprobs, job.logprob_text, true);
    }
  }
  if (job.return_experts) meta["routed_experts"] = s.routed_experts;
  if (job.return_indexer) meta["indexer_topk"] = s.indexer_topk;
  return json{{"text", out.text}, {"output_ids", s.output_ids}, {"meta_info", meta}};
}

std::string sample_id(const GenJob& job, const std::string& base, size_t k) {
  return !job.batched && job.params.n == 1 ? base : base + "-" + std::to_string(k);
}

json generate_response(const GenJob& job, const std::vector<rollout::RequestResult>& results,
                       const std::vector<SampleOutput>& outputs, const tokenizer::Tokenizer* tok,
                       const ResponseInfo& info) {
  json items = json::array();
  size_t k = 0;
  for (const auto& r : results)
    for (size_t j = 0; j < r.samples.size(); ++j, ++k)
      items.push_back(generate_item(job, r, j, outputs[k], tok, sample_id(job, info.id, k)));
  return !job.batched && job.params.n == 1 ? items[0] : items;
}

std::string echo_text(const GenJob& job, const std::vector<int32_t>& prompt_ids,
                      const tokenizer::Tokenizer* tok) {
  return tok ? tok->decode(prompt_ids, job.skip_special_tokens) : "";
}

namespace {
// Completions logprobs with echo: the prompt's tokens (the first without a
// logprob) then the sample's.
json echo_logprobs(const GenJob& job, const rollout::RequestResult& r, const rollout::SampleResult& s,
                   const tokenizer::Tokenizer* tok) {
  std::vector<int32_t> ids = r.prompt_ids;
  ids.insert(ids.end(), s.output_ids.begin(), s.output_ids.end());
  std::vector<float> lps = r.prompt_logprobs;
  lps.insert(lps.end(), s.logprobs.begin(), s.logprobs.end());
  if (job.params.top_logprobs == 0) return completions_logprobs(tok, ids, lps, 0, nullptr, job.tokens_as_ids);
  std::vector<rollout::TopLogprobs> top = r.prompt_top_logprobs;
  top.insert(top.end(), s.top_logprobs.begin(), s.top_logprobs.end());
  return completions_logprobs(tok, ids, lps, 0, &top, job.tokens_as_ids);
}
}  // namespace

json completions_response(const GenJob& job, const std::vector<rollout::RequestResult>& results,
                          const std::vector<SampleOutput>& outputs, const tokenizer::Tokenizer* tok,
                          const ResponseInfo& info) {
  const bool chat = job.api == Api::Chat;
  json choices = json::array();
  int64_t prompt_tokens = 0, completion_tokens = 0;
  size_t k = 0;
  for (const auto& r : results) {
    prompt_tokens += int64_t(r.prompt_ids.size());
    for (const auto& s : r.samples) {
      completion_tokens += int64_t(s.output_ids.size());
      const SampleOutput& o = outputs[k];
      json c = {{"index", k}, {"finish_reason", o.openai_finish}};
      if (o.finish_reason.contains("matched")) c["matched_stop"] = o.finish_reason["matched"];
      const auto* top = job.params.top_logprobs > 0 ? &s.top_logprobs : nullptr;
      if (chat) {
        c["message"] = {{"role", "assistant"}, {"content", o.text}};
        c["logprobs"] = job.return_logprob
                            ? chat_logprobs(tok, s.output_ids, s.logprobs, top, job.tokens_as_ids)
                            : json(nullptr);
      } else if (job.echo) {
        c["text"] = echo_text(job, r.prompt_ids, tok) + o.text;
        c["logprobs"] = job.return_logprob ? echo_logprobs(job, r, s, tok) : json(nullptr);
      } else {
        c["text"] = o.text;
        c["logprobs"] = job.return_logprob
                            ? completions_logprobs(tok, s.output_ids, s.logprobs, 0, top, job.tokens_as_ids)
                            : json(nullptr);
      }
      choices.push_back(std::move(c));
      ++k;
    }
  }
  return json{{"id", info.id},
              {"object", chat ? "chat.completion" : "text_completion"},
              {"created", info.created},
              {"model", job.model},
              {"choices", choices},
              {"usage",
               {{"prompt_tokens", prompt_tokens},
                {"completion_tokens", completion_tokens},
                {"total_tokens", prompt_tokens + completion_tokens}}}};
}

}  // namespace lockstep::serve
