// Fuzz target: the HTTP request bodies of `lockstep serve` (/generate,
// /v1/completions, /v1/chat/completions), parsed as the server parses them:
// parse_json_body, then each API's parser, with a byte-level tokenizer. A bad
// body must be a client error: HttpError with a 4xx status, or
// lockstep::Error (which the server also answers with 400). Any other
// exception would be a 500.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "fuzz_common.h"
#include "lockstep/serve/protocol.h"
#include "lockstep/tokenizer/byte_level.h"

namespace fs = std::filesystem;
using namespace lockstep;
using namespace lockstep::serve;

namespace {

fs::path g_dir;
const tokenizer::Tokenizer* g_tok = nullptr;

void remove_dir() {
  std::error_code ec;
  fs::remove_all(g_dir, ec);
}

// Runs fn as the server's route wrapper does; false when the request was refused.
template <typename Fn>
bool run_as_handler(Fn&& fn) {
  try {
    fn();
    return true;
  } catch (const HttpError& e) {
    LS_FUZZ_EXPECT(e.status() >= 400 && e.status() < 500,
                   "status " + std::to_string(e.status()) + " for a bad body: " + e.what());
    fuzz::check_error_message(e.what());
    return false;
  } catch (const Error& e) {
    fuzz::check_error_message(e.what());
    return false;
  }
}

void check_job(const GenJob& job, const ModelLimits& lim) {
  LS_FUZZ_EXPECT(!job.prompts.empty(), "a job without prompts");
  LS_FUZZ_EXPECT(job.params.n >= 1, "n < 1");
  LS_FUZZ_EXPECT(int64_t(job.prompts.size()) * job.params.n <= lim.max_samples, "max_samples");
  for (const auto& p : job.prompts) {
    LS_FUZZ_EXPECT(!p.empty(), "an empty prompt");
    for (const int32_t id : p)
      LS_FUZZ_EXPECT(id >= 0 && id < lim.vocab_size, "prompt id " + std::to_string(id));
    run_as_handler([&] { echo_text(job, p, g_tok); });
  }
  // The stop checker runs on every generated token; feed it the prompt.
  if (!job.params.stop.empty()) {
    const auto checker = make_stop_checker(*g_tok, job.params.stop, job.skip_special_tokens);
    checker(job.prompts[0]);
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  g_dir = fs::temp_directory_path() / ("lockstep_fuzz_serve_" + std::to_string(::getpid()));
  tokenizer::write_byte_level_tokenizer(g_dir);
  std::atexit(remove_dir);
  g_tok = new tokenizer::Tokenizer(tokenizer::Tokenizer::load(g_dir));
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string body(reinterpret_cast<const char*>(data), size);
  nlohmann::json j;
  if (!run_as_handler([&] { j = parse_json_body(body); })) return 0;
  ModelLimits lim;
  lim.vocab_size = g_tok->vocab_size();
  lim.context = 512;
  lim.served_name = "fuzz-model";
  lim.max_samples = 256;
  for (const Api api : {Api::Generate, Api::Completions, Api::Chat}) {
    for (const tokenizer::Tokenizer* tok : {g_tok, static_cast<const tokenizer::Tokenizer*>(nullptr)}) {
      GenJob job;
      const bool ok = run_as_handler([&] {
        job = api == Api::Generate      ? parse_generate(j, tok, lim)
              : api == Api::Completions ? parse_completions(j, tok, lim)
                                        : parse_chat(j, tok, lim);
      });
      if (ok && tok) check_job(job, lim);
    }
  }
  return 0;
}
