// `lockstep serve`: an SGLang- and OpenAI-compatible HTTP server over the
// rollout engine (docs/server.md). SIGINT/SIGTERM stop it gracefully: no new
// connections, requests in flight finish (or are aborted after
// --shutdown-timeout; a second signal aborts them at once).
#include <pthread.h>
#include <signal.h>

#include <iostream>
#include <thread>

#include "lockstep/base/error.h"
#include "lockstep/base/log.h"
#include "lockstep/cli/command.h"
#include "lockstep/model/model_source.h"
#include "lockstep/cli/rollout_flags.h"
#include "lockstep/serve/server.h"
#include "lockstep/rollout/rollout_config.h"

namespace lockstep::cli {
namespace {

int run_serve(const Args& args) {
  args.check_known({"model",
                    "host",
                    "port",
                    "api-key",
                    "threads",
                    "http-threads",
                    "kv-blocks",
                    "block-size",
                    "max-batch-tokens",
                    "max-running",
                    "max-prefill-chunk",
                    "no-prefix-cache",
                    "seed",
                    "served-model-name",
                    "chat-template",
                    "max-body-bytes",
                    "request-timeout",
                    "header-timeout",
                    "keep-alive-timeout",
                    "max-samples",
                    "shutdown-timeout",
                    "update-policy",
                    "precision",
                    "fp8-block",
                    "device"});
  serve::ServerOptions o;
  o.model_dir = args.require("model");
  o.host = args.get("host", "127.0.0.1");
  const int64_t port = args.get_int("port", 30000);
  if (port < 0 || port > 65535) LS_THROW << "--port must be in [0, 65535], got " << port;
  o.port = int(port);
  o.api_key = args.get("api-key", "");
  o.served_model_name = args.get("served-model-name", "");
  o.chat_template = args.get("chat-template", "auto");
  const int64_t body = args.get_int("max-body-bytes", int64_t(o.max_body_bytes));
  if (body < 1024) LS_THROW << "--max-body-bytes must be >= 1024, got " << body;
  o.max_body_bytes = size_t(body);
  o.request_timeout_s = args.get_double("request-timeout", o.request_timeout_s);
  o.max_samples_per_request = args.get_int("max-samples", o.max_samples_per_request);
  if (o.max_samples_per_request < 1)
    LS_THROW << "--max-samples must be >= 1, got " << o.max_samples_per_request;
  if (!(o.request_timeout_s > 0 && o.request_timeout_s <= 86400))
    LS_THROW << "--request-timeout must be in (0, 86400] seconds, got " << o.request_timeout_s;
  o.header_timeout_s = args.get_double("header-timeout", o.header_timeout_s);
  if (!(o.header_timeout_s > 0 && o.header_timeout_s <= 86400))
    LS_THROW << "--header-timeout must be in (0, 86400] seconds, got " << o.header_timeout_s;
  const int64_t keep_alive = args.get_int("keep-alive-timeout", o.keep_alive_timeout_s);
  if (keep_alive < 1 || keep_alive > 3600)
    LS_THROW << "--keep-alive-timeout must be in [1, 3600] seconds, got " << keep_alive;
  o.keep_alive_timeout_s = int(keep_alive);
  const int64_t http_threads = args.get_int("http-threads", o.http_threads);
  if (http_threads < 1 || http_threads > 4096)
    LS_THROW << "--http-threads must be in [1, 4096], got " << http_threads;
  o.http_threads = int(http_threads);
  o.shutdown_timeout_s = args.get_double("shutdown-timeout", o.shutdown_timeout_s);
  if (!(o.shutdown_timeout_s >= 0)) LS_THROW << "--shutdown-timeout must be >= 0";

  o.engine = engine_config_from_args(args);
  rollout::EngineConfig& e = o.engine;
  o.precision = args.get("precision", "f32");
  o.storage = rollout::precision_dtype(o.precision);
  o.fp8_block = args.get_int("fp8-block", 128);
  if (o.fp8_block < 0) LS_THROW << "--fp8-block must be >= 0";
  const std::string policy = args.get("update-policy", "finish");
  if (policy == "finish")
    e.update_policy = rollout::EngineConfig::UpdatePolicy::Finish;
  else if (policy == "abort")
    e.update_policy = rollout::EngineConfig::UpdatePolicy::Abort;
  else
    LS_THROW << "--update-policy must be finish or abort, got " << policy;

  // Signals go to one watcher thread (sigwait), never to a handler: block them
  // before any other thread exists so every thread inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGUSR1);  // internal: wakes the watcher when serving ends
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto pool = make_pool(args.get_int("threads", 0));
  Context ctx{pool.get(), e.seed};
  set_device(ctx, args);
  serve::ApiServer server(ctx, o);
  const int bound = server.bind();
  std::cout << "lockstep serve: listening on http://" << o.host << ":" << bound << " (model " << o.model_dir
            << ", " << pool->size() << " compute threads, " << o.http_threads << " HTTP threads"
            << (o.api_key.empty() ? "" : ", API key required") << ")" << std::endl;

  std::atomic<bool> done{false};
  std::thread watcher([&] {
    int signals_seen = 0;
    for (;;) {
      int sig = 0;
      if (sigwait(&signals, &sig) != 0) continue;
      if (done) return;
      if (sig == SIGUSR1) continue;
      ++signals_seen;
      LS_LOG(Info) << "serve: " << (sig == SIGINT ? "SIGINT" : "SIGTERM")
                   << (signals_seen == 1 ? ": finishing requests in flight (signal again to abort them)"
                                         : ": aborting requests in flight");
      server.stop();
    }
  });
  try {
    server.serve();
  } catch (...) {
    done = true;
    pthread_kill(watcher.native_handle(), SIGUSR1);
    watcher.join();
    throw;
  }
  done = true;
  pthread_kill(watcher.native_handle(), SIGUSR1);
  watcher.join();
  std::cout << "lockstep serve: stopped" << std::endl;
  return 0;
}

LS_REGISTER_COMMAND(Command{
    "serve",
    "HTTP server: SGLang /generate and OpenAI-compatible endpoints over the rollout engine",
    "usage: lockstep serve --model DIR [--host 127.0.0.1] [--port 30000] [--api-key KEY]\n"
    "                      [--threads N] [--http-threads 64] [--kv-blocks 4096] [--block-size 16]\n"
    "                      [--max-batch-tokens 2048] [--max-running 256] [--max-prefill-chunk 512]\n"
    "                      [--no-prefix-cache] [--seed 0] [--served-model-name NAME]\n"
    "                      [--chat-template auto|chatml|llama3|deepseek|raw] [--max-body-bytes 16777216]\n"
    "                      [--request-timeout 30] [--header-timeout 5] [--keep-alive-timeout 5]\n"
    "                      [--max-samples 65536]\n"
    "                      [--shutdown-timeout 30] [--update-policy finish|abort]\n"
    "                      [--precision f32|bf16|fp8] [--fp8-block 128] [--device cpu|interpret|cuda|hip]\n\n"
    "Serves the Hugging Face model directory DIR (config.json, safetensors, tokenizer.json):\n"
    "  POST /generate                  SGLang native generation (text or input_ids, batches, n, stream)\n"
    "  POST /v1/completions            OpenAI completions        POST /v1/chat/completions  OpenAI chat\n"
    "  GET  /health  /health_generate  liveness / one-token generation check\n"
    "  GET  /get_model_info  /v1/models  /metrics (Prometheus)\n"
    "  POST /update_weights_from_disk  {\"model_path\": DIR}: new weights, same architecture\n"
    "  POST /abort_request             {\"rid\": ID} or {\"abort_all\": true}: abort generation requests\n"
    "  POST /flush_cache               drop the prefix cache\n"
    "Binds 127.0.0.1 unless --host says otherwise; --port 0 picks a free port (printed).\n"
    "With --api-key, every endpoint except /health, /health_generate and /metrics needs\n"
    "'Authorization: Bearer KEY'. Bodies past --max-body-bytes get 413; a request not whole\n"
    "--request-timeout seconds after its first byte gets 408 and its connection is closed,\n"
    "as does one whose headers are not whole after --header-timeout seconds (or that sends\n"
    "nothing for 0.25 s of its headers while other connections wait for a worker);\n"
    "an idle keep-alive connection is closed after --keep-alive-timeout seconds, or after\n"
    "0.25 s while other connections wait for one of the --http-threads workers;\n"
    "more than --max-samples samples (prompts x n) in one request get 400.\n"
    "--precision f32 (default), bf16 or fp8 packs the weights in that precision: logprobs\n"
    "equal a trainer's in the same precision bit for bit (`lockstep score --precision`,\n"
    "`lockstep rl` with [model] precision). --device runs the engine's kernels on a GPU backend\n"
    "(interpret: the GPU kernel sources emulated on the CPU; docs/gpu.md), with the CPU's bits.\n"
    "SIGINT/SIGTERM: stop accepting, finish requests\n"
    "in flight (abort them after --shutdown-timeout seconds, or on a second signal).\n"
    "See docs/server.md.\n",
    {"no-prefix-cache"},
    run_serve});

}  // namespace
}  // namespace lockstep::cli
