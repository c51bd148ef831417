// The wire formats of `lockstep serve`: parsing SGLang /generate and OpenAI
// /v1/completions, /v1/chat/completions bodies into one GenJob (every field
// type-checked, unknown keys rejected), and turning finished samples into
// their JSON answers. No sockets or threads here; server.cpp does those.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "lockstep/rollout/engine.h"
#include "lockstep/tokenizer/tokenizer.h"

namespace lockstep::serve {

// A request the server answers with `status` and
// {"error": {"message", "type", "code"}} (OpenAI's error shape, which SGLang
// also uses).
class HttpError : public std::runtime_error {
 public:
  HttpError(int status, const std::string& message, std::string type = "invalid_request_error")
      : std::runtime_error(message), status_(status), type_(std::move(type)) {}
  int status() const { return status_; }
  const std::string& type() const { return type_; }

 private:
  int status_;
  std::string type_;
};

nlohmann::json error_body(int status, const std::string& message, const std::string& type);

// Deepest nesting of arrays and objects a request body may have.
constexpr size_t kMaxJsonDepth = 64;
// A request body as JSON; HttpError(400) when it is empty, holds a NUL byte,
// nests deeper than kMaxJsonDepth or does not parse (bad syntax, or a number
// past double's range).
nlohmann::json parse_json_body(const std::string& body);

enum class Api { Generate, Completions, Chat };

// One HTTP generation request, whichever API it came through.
struct GenJob {
  Api api = Api::Generate;
  std::vector<std::vector<int32_t>> prompts;  // token ids, one list per prompt
  rollout::SamplingParams params;             // params.n samples per prompt
  bool batched = false;                       // /generate: text or input_ids was a list (answer is a list)
  bool stream = false;
  bool return_logprob = false;  // logprob of every output token (params.top_logprobs alternatives too)
  int64_t logprob_start = -1;  // >= 0: prompt logprobs from this position (/generate logprob_start_len, echo)
  bool echo = false;           // completions: the prompt's text (and logprobs) before the completion
  bool logprob_text = false;   // /generate return_text_in_logprobs: token text beside each logprob
  bool skip_special_tokens = true;
  bool no_stop_trim = false;    // keep the matched stop string in the text
  bool return_experts = false;  // /generate return_routed_experts
  bool return_indexer = false;  // /generate return_indexer_topk (DeepSeek-V4's indexer choices)
  bool include_usage = false;   // OpenAI stream_options.include_usage
  bool tokens_as_ids = false;   // vLLM's return_tokens_as_token_ids: tokens named "token_id:N"
  std::string rid;              // /generate rid: echoed as meta_info.id
  std::string model;            // OpenAI `model`, echoed back
};

// What request parsing needs to know about the model.
struct ModelLimits {
  int64_t vocab_size = 0;
  int64_t context = 0;  // max_position_embeddings
  std::string served_name;
  // Samples (prompts x n) one request may ask for: each holds engine state
  // and a share of the answer until the whole request is done.
  int64_t max_samples = 65536;
};

// Each throws HttpError(400) naming the offending field. `tok` may be null
// (a model without tokenizer.json: only input_ids prompts then work).
GenJob parse_generate(const nlohmann::json& body, const tokenizer::Tokenizer* tok, const ModelLimits& lim);
GenJob parse_completions(const nlohmann::json& body, const tokenizer::Tokenizer* tok, const ModelLimits& lim);
GenJob parse_chat(const nlohmann::json& body, const tokenizer::Tokenizer* tok, const ModelLimits& lim);

// A finished sample, its text decoded and cut at the stop string.
struct SampleOutput {
  std::string text;
  // SGLang's finish_reason object: {"type": "stop", "matched": id or string},
  // {"type": "length", "length": n} or {"type": "abort", "message": ...}.
  nlohmann::json finish_reason;
  std::string openai_finish;  // "stop", "length" or "abort"
};

// Which stop condition ended `s` and its text (skip_special_tokens and stop
// trimming as the job asks). `eos_ids` are the model's end-of-sequence ids.
SampleOutput finish_sample(const tokenizer::Tokenizer* tok, const GenJob& job, const rollout::SampleResult& s,
                           const std::vector<int32_t>& eos_ids);

// Per-request facts a response echoes.
struct ResponseInfo {
  std::string id;       // response id ("cmpl-...", "chatcmpl-...", or the /generate id base)
  int64_t created = 0;  // Unix seconds
};

// The full non-streaming answers. `results` holds one RequestResult per prompt
// of `job`, in order; `outputs` the finish_sample of every sample, prompt-major.
nlohmann::json generate_response(const GenJob& job, const std::vector<rollout::RequestResult>& results,
                                 const std::vector<SampleOutput>& outputs, const tokenizer::Tokenizer* tok,
                                 const ResponseInfo& info);
// One /generate item: {"text", "output_ids", "meta_info"} of sample `sample` of `r`.
nlohmann::json generate_item(const GenJob& job, const rollout::RequestResult& r, size_t sample,
                             const SampleOutput& out, const tokenizer::Tokenizer* tok, const std::string& id);
// meta_info.id of the k-th sample (prompt-major): the base id alone for a
// single sample, else base-k.
std::string sample_id(const GenJob& job, const std::string& base, size_t k);
nlohmann::json completions_response(const GenJob& job, const std::vector<rollout::RequestResult>& results,
                                    const std::vector<SampleOutput>& outputs, const tokenizer::Tokenizer* tok,
                                    const ResponseInfo& info);

// OpenAI logprobs of tokens: completions {"tokens", "token_logprobs",
// "top_logprobs", "text_offset"} (top_logprobs null without `top`, else per
// token {text: logprob} of its alternatives and itself; a NaN logprob, a
// prompt's first token, is null); chat {"content": [{"token", "logprob",
// "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}. `top`, when
// given, holds each token's alternatives.
// Tokens are named by token_key (below); each position's top_logprobs keys
// are distinct (a later token whose key is taken gets "token_id:N").
nlohmann::json completions_logprobs(const tokenizer::Tokenizer* tok, const std::vector<int32_t>& ids,
                                    const std::vector<float>& logprobs, size_t first_text_offset,
                                    const std::vector<rollout::TopLogprobs>* top = nullptr,
                                    bool tokens_as_ids = false);
nlohmann::json chat_logprobs(const tokenizer::Tokenizer* tok, const std::vector<int32_t>& ids,
                             const std::vector<float>& logprobs,
                             const std::vector<rollout::TopLogprobs>* top = nullptr,
                             bool tokens_as_ids = false);
// [[logprob, token_id, text or null], ...] as SGLang's output_token_logprobs
// (a NaN logprob is null: input_token_logprobs' first entry).
nlohmann::json sglang_logprobs(const tokenizer::Tokenizer* tok, const std::vector<int32_t>& ids,
                               const std::vector<float>& logprobs, bool with_text);
// SGLang's output_top_logprobs / input_top_logprobs: per position a list of
// [logprob, token_id, text or null]; an empty position is null when
// `empty_is_null` (the prompt's first token).
nlohmann::json sglang_top_logprobs(const tokenizer::Tokenizer* tok,
                                   const std::vector<rollout::TopLogprobs>& top, bool with_text,
                                   bool empty_is_null);
// The prompt's text as completions' echo gives it.
std::string echo_text(const GenJob& job, const std::vector<int32_t>& prompt_ids,
                      const tokenizer::Tokenizer* tok);

// Text of one token as OpenAI reports it (its own decode, special tokens kept).
std::string token_text(const tokenizer::Tokenizer* tok, int32_t id);
// A token as the OpenAI APIs name it in `tokens` and `top_logprobs`: its text;
// "bytes:\\xNN..." (one \\xNN per byte, as OpenAI writes them) when its bytes
// are not whole UTF-8 (part of a character); "token_id:N" with vLLM's
// return_tokens_as_token_ids, or when there is no tokenizer.
std::string token_key(const tokenizer::Tokenizer* tok, int32_t id, bool as_ids);

// Returns the index in `text` where the first stop string begins, or npos.
size_t find_stop(const std::string& text, const std::vector<std::string>& stops,
                 std::string* matched = nullptr);
// Length of the longest suffix of `text` that is a proper prefix of some stop
// string: text a stream must hold back because a stop string may complete there.
size_t stop_holdback(const std::string& text, const std::vector<std::string>& stops);

// The engine's stop_checker for `stops`: the output offset (tokens) at which a
// stop string completes, -1 while none has. Matching runs on the text the
// client gets (special tokens skipped or not, as it asked), as vLLM does.
std::function<int64_t(const std::vector<int32_t>&)> make_stop_checker(const tokenizer::Tokenizer& tok,
                                                                      std::vector<std::string> stops,
                                                                      bool skip_special_tokens);

}  // namespace lockstep::serve
