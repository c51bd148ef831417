// Internals of ApiServer shared by server.cpp (lifecycle, admin
// endpoints, metrics) and generate.cpp (the generation endpoints).
#pragma once

#include <httplib.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "lockstep/model/params.h"
#include "lockstep/model/weights.h"
#include "lockstep/serve/http_server.h"
#include "lockstep/serve/protocol.h"
#include "lockstep/serve/server.h"
#include "lockstep/tokenizer/tokenizer.h"

namespace lockstep::serve {

// One set of weights the engine may read: the flat f32 buffer, its layout and
// the packed ModelWeights (which point into both, so a WeightSet never moves).
struct WeightSet {
  ParamLayout layout;
  Buffer params;
  std::unique_ptr<model::ModelWeights> weights;
  std::string path;
};

// A token the engine produced for a streamed request.
struct TokenEvent {
  int prompt = 0;  // index of the prompt within the HTTP request
  int sample = 0;
  int32_t token = 0;
  float logprob = 0;
  rollout::TopLogprobs top;  // its alternatives, when the request asks
};

// The engine requests behind one HTTP request. Aborting (client gone,
// shutdown, abort_all_requests) is a sweep that aborts every id submitted so
// far and repeats until all futures are ready (prompts of the request may
// still be being submitted).
struct Inflight {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<uint64_t> ids;  // per prompt; 0 until submitted
  std::vector<bool> abort_sent;
  std::string rid;  // the response's id (the client's rid when it gave one): /abort_request names it
  bool streaming = false;
  std::deque<TokenEvent> events;  // streaming only
  std::vector<std::future<rollout::RequestResult>> futures;
  std::atomic<bool> abort_wanted{false};

  bool all_ready() const;
};

struct ApiServer::Impl {
  Impl(const Context& ctx, ServerOptions options);

  // --- lifecycle (server.cpp)
  void install_routes();
  void housekeeping_loop();
  void abort_sweep(Inflight& f);  // aborts every known id of f not aborted yet
  void abort_all_inflight();

  // --- endpoints
  void handle_generation(Api api, const httplib::Request& req, httplib::Response& res);  // generate.cpp
  void handle_health_generate(httplib::Response& res);
  void handle_model_info(httplib::Response& res);
  void handle_update_weights(const httplib::Request& req, httplib::Response& res);
  void handle_abort_request(const httplib::Request& req, httplib::Response& res);
  void handle_metrics(httplib::Response& res);

  // --- generation helpers (generate.cpp)
  std::shared_ptr<Inflight> submit(const GenJob& job, const std::string& rid = "");
  // Waits for every prompt's result; aborts them once f.abort_wanted is set
  // or `client_gone` (polled) says the client left.
  std::vector<rollout::RequestResult> wait_all(Inflight& f, const std::function<bool()>& client_gone = {});
  std::vector<SampleOutput> outputs_of(const GenJob& job,
                                       const std::vector<rollout::RequestResult>& results) const;
  // Writes the whole event stream; false when the client went away.
  bool stream(const GenJob& job, const std::shared_ptr<Inflight>& f, const ResponseInfo& info,
              httplib::DataSink& sink);

  ModelLimits limits() const;
  std::string next_id(const char* prefix);
  const tokenizer::Tokenizer* tok() const { return tokenizer ? &*tokenizer : nullptr; }

  Context ctx;
  ServerOptions opt;
  std::optional<tokenizer::Tokenizer> tokenizer;
  std::vector<int32_t> eos_ids;
  ModelConfig config;  // architecture of the served model (updates must match)

  std::mutex update_mu;   // serialises weight updates (held while one loads)
  std::mutex weights_mu;  // guards current (held for a moment: readers never wait for a load)
  std::unique_ptr<WeightSet> current;
  std::unique_ptr<rollout::Engine> engine;

  HttpServer http;
  int bound_port = -1;

  std::mutex inflight_mu;
  std::set<std::shared_ptr<Inflight>> inflight;

  // Shutdown and housekeeping.
  std::mutex state_mu;
  std::condition_variable state_cv;
  bool stopping = false;
  bool finished = false;
  std::chrono::steady_clock::time_point abort_deadline;
  std::thread housekeeper;

  // Throughput: (seconds since start, generated tokens) sampled once a second.
  std::mutex rate_mu;
  std::deque<std::pair<double, int64_t>> rate_samples;
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();

  std::atomic<uint64_t> id_counter{0};
  std::atomic<uint64_t> http_answered{0};  // responses written, any status
  std::atomic<int64_t> requests_total{0}, requests_failed{0}, requests_aborted{0};
};

// "data: {json}\n\n"
std::string sse(const nlohmann::json& j);
std::string dump(const nlohmann::json& j);
void set_json(httplib::Response& res, int status, const nlohmann::json& j);
void set_error(httplib::Response& res, int status, const std::string& message,
               const std::string& type = "invalid_request_error");
// The request body as JSON (parse_json_body).
nlohmann::json parse_body(const httplib::Request& req);

}  // namespace lockstep::serve
