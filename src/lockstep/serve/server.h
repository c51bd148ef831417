// The HTTP server behind `lockstep serve`: SGLang's native endpoints
// (/generate, /health, /get_model_info, /update_weights_from_disk, ...) and
// OpenAI's /v1/completions and /v1/chat/completions over one rollout Engine
// running its background loop. docs/server.md describes every endpoint.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "lockstep/base/thread_pool.h"
#include "lockstep/rollout/engine.h"
#include "lockstep/tensor/dtype.h"

namespace lockstep::serve {

struct ServerOptions {
  std::string model_dir;
  std::string host = "127.0.0.1";  // loopback unless asked otherwise (docs/architecture.md section 7)
  int port = 30000;                // 0: any free port (see ApiServer::port)
  std::string api_key;             // empty: no authentication
  std::string served_model_name;   // OpenAI `model`; empty: model_dir
  std::string chat_template = "auto";
  size_t max_body_bytes = size_t(16) << 20;  // larger bodies get 413
  // A request (line, headers, body) must arrive within this many seconds of
  // its first byte, else 408 and the connection is closed: a client trickling
  // bytes cannot hold an HTTP worker for longer.
  double request_timeout_s = 30;
  // A request's line and headers must arrive within this many seconds of its
  // first byte, else 408 and the connection is closed; sooner while other
  // connections wait for a worker (HttpServer::set_header_timeout).
  double header_timeout_s = 5;
  // A keep-alive connection is closed after this many idle seconds (and
  // sooner while other connections wait for a worker, HttpServer).
  int keep_alive_timeout_s = 5;
  int64_t max_samples_per_request = 65536;  // prompts x n; more is a 400
  // HTTP worker threads. A generation request holds one until it finishes,
  // so this bounds the requests in flight (more wait in the accept queue).
  int http_threads = 64;
  double shutdown_timeout_s = 30;  // after SIGTERM, in-flight requests get this long, then abort
  rollout::EngineConfig engine;
  // Storage of the packed projections: F32 is aligned mode (logprobs equal the
  // trainer's); BF16 / FP8E4M3 is fast mode (model/weights.h).
  std::string precision = "f32";
  DType storage = DType::F32;
  int64_t fp8_block = 128;
};

class ApiServer {
 public:
  // Loads the model and tokenizer and builds the engine; throws Error on a bad
  // model directory.
  ApiServer(const Context& ctx, ServerOptions options);
  ~ApiServer();
  ApiServer(const ApiServer&) = delete;
  ApiServer& operator=(const ApiServer&) = delete;

  // Binds host:port; throws Error when the address is taken. Returns the port.
  int bind();
  int port() const;
  // Serves until stop(); returns once every in-flight request has finished
  // (or was aborted when shutdown_timeout_s ran out).
  void serve();
  // Stops accepting, lets requests in flight finish; a second call aborts
  // them at once. Safe from any thread (not from a signal handler).
  void stop();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace lockstep::serve
