// ApiServer: model loading, routes, authentication, error bodies, the admin
// endpoints (health, model info, weight updates, cache flush, metrics) and
// graceful shutdown. The generation endpoints live in generate.cpp.
#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <sstream>
#include <utility>

#include "lockstep/base/error.h"
#include "lockstep/base/excerpt.h"
#include "lockstep/base/log.h"
#include "lockstep/base/timer.h"
#include "lockstep/model/model_source.h"
#include "lockstep/model/pretrained.h"
#include "lockstep/serve/server_impl.h"

namespace lockstep::serve {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}
std::string sse(const json& j) {
  return "data: " + dump(j) + "\n\n";
}

void set_json(httplib::Response& res, int status, const json& j) {
  res.status = status;
  res.set_content(dump(j), "application/json");
}

void set_error(httplib::Response& res, int status, const std::string& message, const std::string& type) {
  set_json(res, status, error_body(status, message, type));
}

json parse_body(const httplib::Request& req) {
  return parse_json_body(req.body);
}

namespace {

// Fields of ModelConfig that must agree for new weights to be loadable into
// the running engine (the engine checks the tensor layout; this names the field).
std::string config_mismatch(const ModelConfig& a, const ModelConfig& b) {
  std::ostringstream os;
  auto cmp = [&](const char* name, auto x, auto y) {
    if (x != y && os.tellp() == 0) os << name << " " << y << " (serving " << x << ")";
  };
  cmp("architecture", std::string(architecture_name(a.architecture)),
      std::string(architecture_name(b.architecture)));
  cmp("vocab_size", a.vocab_size, b.vocab_size);
  cmp("hidden_size", a.hidden_size, b.hidden_size);
  cmp("num_layers", a.num_layers, b.num_layers);
  cmp("num_heads", a.num_heads, b.num_heads);
  cmp("num_kv_heads", a.num_kv_heads, b.num_kv_heads);
  cmp("head_dim", a.head_dim, b.head_dim);
  cmp("intermediate_size", a.intermediate_size, b.intermediate_size);
  cmp("num_experts", a.num_experts, b.num_experts);
  cmp("num_experts_per_tok", a.num_experts_per_tok, b.num_experts_per_tok);
  cmp("moe_intermediate_size", a.moe_intermediate_size, b.moe_intermediate_size);
  cmp("max_position_embeddings", a.max_position_embeddings, b.max_position_embeddings);
  if (os.tellp() != 0) return os.str();
  // Everything else (norm eps, rope theta, router options, ...) in one go.
  ModelConfig x = a, y = b;
  y.bos_token_id = x.bos_token_id;
  y.eos_token_ids = x.eos_token_ids;
  if (!(x == y)) return "a model setting (rope_theta, rms_norm_eps, router or shared-expert options) differs";
  return "";
}

std::unique_ptr<WeightSet> make_weight_set(const Context& ctx, const ServerOptions& opt, PretrainedModel p,
                                           const std::string& path, uint64_t version) {
  auto ws = std::make_unique<WeightSet>();
  ws->layout = std::move(p.layout);
  ws->params = std::move(p.params);
  ws->path = path;
  ws->weights = std::make_unique<model::ModelWeights>(ctx, ws->layout, ws->params.as<float>(), opt.storage,
                                                      opt.fp8_block);
  if (version != 0) ws->weights->refresh(ctx, version);
  return ws;
}

// Paths reachable without the API key: liveness checks and scraping.
bool is_open_path(const std::string& path) {
  return path == "/health" || path == "/health_generate" || path == "/metrics";
}

}  // namespace

ApiServer::Impl::Impl(const Context& c, ServerOptions o) : ctx(c), opt(std::move(o)) {
  // A fixed mmap threshold. glibc's default one rises to the size of the
  // largest block freed (up to 32 MiB), and the trim threshold with it to
  // twice that; after a few multi-MB request bodies every thread arena then
  // keeps up to 64 MiB of freed memory at its top, which malloc_trim does not
  // hand back. Fixed, blocks past 1 MiB (bodies, their parsed strings,
  // tokenizer scratch) are mapped and unmapped on their own.
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  if (opt.served_model_name.empty()) opt.served_model_name = opt.model_dir;
  LoadedModel m = load_model_dir(opt.model_dir, ctx, opt.chat_template);
  config = m.config;
  for (int64_t e : m.config.eos_token_ids) eos_ids.push_back(int32_t(e));
  tokenizer = std::move(m.tokenizer);
  if (!tokenizer) {
    LS_LOG(Warn) << opt.model_dir << ": no tokenizer.json; only token-id prompts will work";
  }
  PretrainedModel p;
  p.config = m.config;
  p.layout = ParamLayout(m.config);
  p.params = std::move(m.params);
  current = make_weight_set(ctx, opt, std::move(p), opt.model_dir, 0);
  engine = std::make_unique<rollout::Engine>(ctx, current->weights.get(), opt.engine);
  install_routes();
}

ModelLimits ApiServer::Impl::limits() const {
  return ModelLimits{config.vocab_size, config.max_position_embeddings, opt.served_model_name,
                     opt.max_samples_per_request};
}

std::string ApiServer::Impl::next_id(const char* prefix) {
  // Unique within a server run; the start time keeps ids of restarts apart.
  static const auto epoch = std::chrono::system_clock::now().time_since_epoch().count();
  std::ostringstream os;
  os << prefix << std::hex << (uint64_t(epoch) & 0xffffffffffull) << "-" << std::dec << ++id_counter;
  return os.str();
}

void ApiServer::Impl::install_routes() {
  // Wraps a handler: HttpError and lockstep::Error become JSON error bodies.
  auto guarded = [this](auto fn) {
    return [this, fn](const httplib::Request& req, httplib::Response& res) {
      try {
        fn(req, res);
      } catch (const HttpError& e) {
        if (e.status() >= 500) ++requests_failed;
        set_error(res, e.status(), e.what(), e.type());
      } catch (const Error& e) {
        set_error(res, 400, e.what());
      } catch (const std::exception& e) {
        ++requests_failed;
        LS_LOG(Error) << "serve: " << req.method << " " << req.path << ": " << e.what();
        set_error(res, 500, std::string("internal error: ") + e.what(), "server_error");
      }
    };
  };

  http.set_payload_max_length(opt.max_body_bytes);
  // Without TCP_NODELAY a response's header and body writes meet the
  // client's delayed ACK: ~40 ms per request on loopback.
  http.set_tcp_nodelay(true);
  // httplib closes a keep-alive connection after 5 requests by default; RL
  // clients send thousands over a few connections.
  http.set_keep_alive_max_count(1000);
  http.set_keep_alive_timeout(opt.keep_alive_timeout_s);
  http.set_request_timeout(opt.request_timeout_s);
  http.set_header_timeout(opt.header_timeout_s);
  // Errors httplib produces itself (404, 413, 400 on a malformed request,
  // 408 when that was a request past its deadline)
  // get the same JSON body as ours.
  http.set_error_handler(
      httplib::Server::HandlerWithResponse([this](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        if (res.status == 400 && HttpServer::request_timed_out()) res.status = 408;
        std::string msg = res.status == 404 ? "no such endpoint: " + req.method + " " + req.path
                          : res.status == 413
                              ? "request body too large (limit " + std::to_string(opt.max_body_bytes) +
                                    " bytes; see --max-body-bytes)"
                          : res.status == 408 ? http.timeout_message()
                                              : "bad request";
        set_error(res, res.status, msg);
        return httplib::Server::HandlerResponse::Handled;
      }));
  // Every answered request, whatever its status: the housekeeper trims the
  // heap after any burst, also one of rejected requests (a 16 MB body that
  // fails to parse leaves as much freed heap as one that generates).
  http.set_logger([this](const httplib::Request&, const httplib::Response&) { ++http_answered; });
  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (opt.api_key.empty() || is_open_path(req.path)) return httplib::Server::HandlerResponse::Unhandled;
    if (req.get_header_value("Authorization") == "Bearer " + opt.api_key)
      return httplib::Server::HandlerResponse::Unhandled;
    set_error(res, 401, "missing or wrong API key (send Authorization: Bearer <key>)",
              "authentication_error");
    return httplib::Server::HandlerResponse::Handled;
  });

  http.Get("/health",
           [](const httplib::Request&, httplib::Response& res) { res.set_content("OK", "text/plain"); });
  http.Get("/health_generate",
           guarded([this](const httplib::Request&, httplib::Response& res) { handle_health_generate(res); }));
  http.Get("/get_model_info",
           guarded([this](const httplib::Request&, httplib::Response& res) { handle_model_info(res); }));
  http.Get("/v1/models", guarded([this](const httplib::Request&, httplib::Response& res) {
             set_json(res, 200,
                      {{"object", "list"},
                       {"data", json::array({{{"id", opt.served_model_name},
                                              {"object", "model"},
                                              {"created", 0},
                                              {"owned_by", "lockstep"},
                                              {"max_model_len", config.max_position_embeddings}}})}});
           }));
  http.Get("/metrics",
           guarded([this](const httplib::Request&, httplib::Response& res) { handle_metrics(res); }));
  http.Post("/generate", guarded([this](const httplib::Request& req, httplib::Response& res) {
              ++requests_total;
              handle_generation(Api::Generate, req, res);
            }));
  http.Post("/v1/completions", guarded([this](const httplib::Request& req, httplib::Response& res) {
              ++requests_total;
              handle_generation(Api::Completions, req, res);
            }));
  http.Post("/v1/chat/completions", guarded([this](const httplib::Request& req, httplib::Response& res) {
              ++requests_total;
              handle_generation(Api::Chat, req, res);
            }));
  http.Post("/update_weights_from_disk", guarded([this](const httplib::Request& req, httplib::Response& res) {
              handle_update_weights(req, res);
            }));
  auto flush = guarded([this](const httplib::Request&, httplib::Response& res) {
    engine->flush_cache();
    set_json(res, 200, {{"success", true}, {"message", "cache flushed"}});
  });
  http.Post("/abort_request", guarded([this](const httplib::Request& req, httplib::Response& res) {
              handle_abort_request(req, res);
            }));
  http.Post("/flush_cache", flush);
  http.Get("/flush_cache", flush);  // SGLang accepts both
}

void ApiServer::Impl::handle_health_generate(httplib::Response& res) {
  // One greedy token through the whole engine path.
  GenJob job;
  job.prompts = {{config.bos_token_id >= 0 ? int32_t(config.bos_token_id) : 0}};
  job.params.temperature = 0;
  job.params.max_new_tokens = 1;
  job.params.ignore_eos = true;
  auto f = submit(job);
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  // submit() has returned, so nothing else touches f->futures now; waiting
  // under f->mu would block the engine's token callback.
  const bool ok = f->futures[0].wait_until(deadline) == std::future_status::ready;
  if (!ok) f->abort_wanted = true;
  auto results = wait_all(*f);
  {
    std::lock_guard<std::mutex> l(inflight_mu);
    inflight.erase(f);
  }
  if (!ok || results.empty() || results[0].samples.empty() || results[0].samples[0].output_ids.empty())
    throw HttpError(503, "the engine did not produce a token", "server_error");
  res.set_content("OK", "text/plain");
}

void ApiServer::Impl::handle_model_info(httplib::Response& res) {
  std::string path;
  {
    std::lock_guard<std::mutex> l(weights_mu);
    path = current->path;
  }
  const ParamLayout layout(config);
  set_json(res, 200,
           {{"model_path", path},
            {"tokenizer_path", tokenizer ? opt.model_dir : ""},
            {"served_model_name", opt.served_model_name},
            {"is_generation", true},
            {"architecture", architecture_name(config.architecture)},
            {"model_type", architecture_model_type(config.architecture)},
            {"vocab_size", config.vocab_size},
            {"tokenizer_vocab_size", tokenizer ? json(tokenizer->vocab_size()) : json(nullptr)},
            {"max_context_length", config.max_position_embeddings},
            {"num_parameters", layout.numel()},
            {"num_layers", config.num_layers},
            {"hidden_size", config.hidden_size},
            {"num_experts", config.num_experts},
            {"num_experts_per_tok", config.num_experts_per_tok},
            {"eos_token_ids", config.eos_token_ids},
            {"chat_template", tokenizer ? json(tokenizer->chat_template().name()) : json(nullptr)},
            {"weight_version", engine->weight_version()},
            {"precision", opt.precision},
            {"kv_blocks", opt.engine.num_blocks},
            {"kv_block_size", opt.engine.block_size}});
}

void ApiServer::Impl::handle_update_weights(const httplib::Request& req, httplib::Response& res) {
  json body = parse_body(req);
  if (!body.is_object()) throw HttpError(400, "the request body must be a JSON object");
  std::string path;
  std::optional<uint64_t> version;
  bool abort_all = false;
  for (auto it = body.begin(); it != body.end(); ++it) {
    const std::string& k = it.key();
    const json& v = it.value();
    if (k == "model_path") {
      if (!v.is_string() || v.get<std::string>().empty())
        throw HttpError(400, "model_path must be a non-empty string");
      path = v.get<std::string>();
    } else if (k == "weight_version") {
      if (v.is_null()) continue;
      // SGLang sends versions as strings; lockstep's are integers.
      const std::string text = v.is_string() ? v.get<std::string>() : "";
      const bool digits = !text.empty() && text.size() < 20 &&
                          std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
      if (v.is_number_unsigned())
        version = v.get<uint64_t>();
      else if (digits)
        version = std::stoull(text);
      else
        throw HttpError(400, "weight_version must be a non-negative integer (or a string holding one)");
    } else if (k == "abort_all_requests") {
      if (!v.is_boolean()) throw HttpError(400, "abort_all_requests must be a boolean");
      abort_all = v.get<bool>();
    } else if (k == "flush_cache") {
      if (!v.is_boolean()) throw HttpError(400, "flush_cache must be a boolean");
      // The prefix cache is always flushed on a weight change: its KV came from the old weights.
    } else if (k == "load_format") {
      if (!v.is_null() && v != "auto" && v != "safetensors")
        throw HttpError(400, "load_format: only \"auto\" or \"safetensors\" is supported");
    } else {
      throw HttpError(400, "unknown parameter " + excerpt(k) +
                               " (accepted: model_path, weight_version, "
                               "abort_all_requests, flush_cache, load_format)");
    }
  }
  if (path.empty()) throw HttpError(400, "missing model_path");
  // A model directory, or a run's checkpoints/latest (the file naming the newest step_N), as --model takes.
  std::string dir;
  try {
    dir = resolve_model_dir(path);
  } catch (const Error& e) {
    throw HttpError(400, std::string("model_path ") + e.what());
  }

  std::lock_guard<std::mutex> lock(update_mu);
  Timer timer;
  const uint64_t old_version = engine->weight_version();
  const uint64_t new_version = version.value_or(old_version + 1);
  if (new_version == old_version)
    throw HttpError(400, "weight_version " + std::to_string(new_version) + " is the version being served");
  PretrainedModel p;
  try {
    p = load_pretrained(dir, &ctx);
  } catch (const Error& e) {
    throw HttpError(400, std::string("cannot load ") + path + ": " + e.what());
  }
  if (std::string why = config_mismatch(config, p.config); !why.empty())
    throw HttpError(400, path + " holds a different architecture: " + why);
  std::unique_ptr<WeightSet> next = make_weight_set(ctx, opt, std::move(p), path, new_version);
  if (abort_all) abort_all_inflight();
  engine->update_weights(next->weights.get());
  // The engine switches between steps; once it reports the new version no step
  // reads the old weights any more (steps run under the lock weight_version takes).
  while (engine->weight_version() != new_version) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::unique_ptr<WeightSet> old;
  {
    std::lock_guard<std::mutex> l(weights_mu);
    old = std::exchange(current, std::move(next));
  }
  old.reset();  // frees the old weights, outside the lock readers take
  LS_LOG(Info) << "serve: weights from " << path << " are version " << new_version << " (" << timer.seconds()
               << " s)";
  set_json(res, 200,
           {{"success", true},
            {"message", "loaded " + path},
            {"weight_version", new_version},
            {"num_paused_requests", 0},
            {"seconds", timer.seconds()}});
}

// SGLang's /abort_request: {"rid": ID} aborts the generation request whose
// response id is ID (the rid it gave, else the id its answer carries), and
// {"abort_all": true} every one in flight. Aborted samples finish with reason
// abort at the next engine step; an id matching nothing is no error (the
// request may have just finished).
void ApiServer::Impl::handle_abort_request(const httplib::Request& req, httplib::Response& res) {
  json body = parse_body(req);
  if (!body.is_object()) throw HttpError(400, "the request body must be a JSON object");
  std::string rid;
  bool all = false;
  for (auto it = body.begin(); it != body.end(); ++it) {
    if (it.key() == "rid") {
      if (!it.value().is_string()) throw HttpError(400, "rid must be a string");
      rid = it.value().get<std::string>();
    } else if (it.key() == "abort_all") {
      if (!it.value().is_boolean()) throw HttpError(400, "abort_all must be a boolean");
      all = it.value().get<bool>();
    } else {
      throw HttpError(400, "unknown parameter " + excerpt(it.key()) + " (accepted: rid, abort_all)");
    }
  }
  if (rid.empty() && !all) throw HttpError(400, "give rid (a request's id) or \"abort_all\": true");
  std::vector<std::shared_ptr<Inflight>> hit;
  {
    std::lock_guard<std::mutex> l(inflight_mu);
    for (const auto& f : inflight)
      if (all || f->rid == rid) hit.push_back(f);
  }
  for (auto& f : hit) {
    f->abort_wanted = true;
    abort_sweep(*f);
  }
  set_json(res, 200, {{"success", true}, {"aborted", hit.size()}});
}

void ApiServer::Impl::handle_metrics(httplib::Response& res) {
  const rollout::EngineStats s = engine->stats();
  double rate = 0;
  {
    std::lock_guard<std::mutex> l(rate_mu);
    if (rate_samples.size() >= 2) {
      const auto& a = rate_samples.front();
      const auto& b = rate_samples.back();
      if (b.first > a.first) rate = double(b.second - a.second) / (b.first - a.first);
    }
  }
  size_t inflight_http = 0;
  {
    std::lock_guard<std::mutex> l(inflight_mu);
    inflight_http = inflight.size();
  }
  const double usage = s.total_blocks > 0 ? 1.0 - double(s.free_blocks) / double(s.total_blocks) : 0.0;
  std::ostringstream os;
  auto metric = [&](const char* name, const char* type, const char* help, double value) {
    os << "# HELP lockstep_" << name << " " << help << "\n# TYPE lockstep_" << name << " " << type
       << "\nlockstep_" << name << " " << value << "\n";
  };
  metric("num_running_reqs", "gauge", "Samples decoding or prefilling now.", double(s.running));
  metric("num_waiting_reqs", "gauge", "Samples queued for admission.", double(s.waiting));
  metric("num_http_requests_in_flight", "gauge", "Generation HTTP requests being served.",
         double(inflight_http));
  metric("generation_tokens_total", "counter", "Tokens sampled since start.", double(s.generated_tokens));
  metric("prompt_tokens_total", "counter", "Tokens fed to prefill (recomputes included) since start.",
         double(s.prompt_tokens));
  metric("gen_throughput", "gauge", "Generated tokens per second over the last 10 s.", rate);
  metric("kv_usage_ratio", "gauge", "Fraction of KV blocks referenced by running samples.", usage);
  metric("kv_blocks_total", "gauge", "KV cache blocks.", double(s.total_blocks));
  metric("prefix_cache_hit_tokens_total", "counter", "Prompt tokens served from the prefix cache.",
         double(s.prefix_hit_tokens));
  metric("cache_hit_rate", "gauge", "Prefix-cache hit tokens / prompt tokens since start.",
         s.prompt_tokens + s.prefix_hit_tokens > 0
             ? double(s.prefix_hit_tokens) / double(s.prompt_tokens + s.prefix_hit_tokens)
             : 0.0);
  metric("preemptions_total", "counter", "Samples preempted for KV memory.", double(s.preemptions));
  metric("engine_steps_total", "counter", "Engine scheduler steps.", double(s.steps));
  metric("forward_seconds_total", "counter", "Seconds in model forward passes.", s.forward_s);
  metric("requests_total", "counter", "Generation requests received.", double(requests_total.load()));
  metric("requests_failed_total", "counter", "Requests answered with a server error.",
         double(requests_failed.load()));
  metric("samples_aborted_total", "counter", "Samples that finished with reason abort.",
         double(requests_aborted.load()));
  metric("weight_version", "gauge", "Version of the weights being served.", double(engine->weight_version()));
  res.set_content(os.str(), "text/plain; version=0.0.4");
}

void ApiServer::Impl::abort_sweep(Inflight& f) {
  std::vector<uint64_t> ids;
  {
    std::lock_guard<std::mutex> l(f.mu);
    for (size_t p = 0; p < f.ids.size(); ++p)
      if (f.ids[p] != 0 && !f.abort_sent[p]) {
        ids.push_back(f.ids[p]);
        f.abort_sent[p] = true;
      }
  }
  // Outside f.mu: the engine calls our token callbacks (which take f.mu) while
  // holding its own lock, so taking them in the other order would deadlock.
  for (uint64_t id : ids) engine->abort(id);
}

void ApiServer::Impl::abort_all_inflight() {
  std::vector<std::shared_ptr<Inflight>> all;
  {
    std::lock_guard<std::mutex> l(inflight_mu);
    all.assign(inflight.begin(), inflight.end());
  }
  for (auto& f : all) {
    f->abort_wanted = true;
    abort_sweep(*f);
  }
}

void ApiServer::Impl::housekeeping_loop() {
  bool was_busy = false;
  uint64_t answered_seen = 0;
  std::unique_lock<std::mutex> l(state_mu);
  while (!finished) {
    const bool draining_late = stopping && Clock::now() >= abort_deadline;
    state_cv.wait_for(l, draining_late ? std::chrono::milliseconds(10) : std::chrono::milliseconds(1000));
    if (finished) break;
    const bool abort_now = stopping && Clock::now() >= abort_deadline;
    l.unlock();
    const double t = std::chrono::duration<double>(Clock::now() - started).count();
    const rollout::EngineStats s = engine->stats();
    {
      std::lock_guard<std::mutex> rl(rate_mu);
      rate_samples.emplace_back(t, s.generated_tokens);
      while (rate_samples.size() > 11) rate_samples.pop_front();
    }
    if (abort_now) abort_all_inflight();
    // After a burst, hand freed heap back to the OS: glibc keeps freed memory
    // in per-thread arenas, and with dozens of HTTP threads that otherwise
    // stays resident after the requests are gone.
    size_t n_inflight;
    {
      std::lock_guard<std::mutex> il(inflight_mu);
      n_inflight = inflight.size();
    }
    const uint64_t answered = http_answered.load();
    const bool busy = n_inflight > 0 || s.running > 0 || s.waiting > 0 || answered != answered_seen;
    answered_seen = answered;
    if (was_busy && !busy) malloc_trim(0);
    was_busy = busy;
    l.lock();
  }
}

ApiServer::ApiServer(const Context& ctx, ServerOptions options)
    : impl_(std::make_unique<Impl>(ctx, std::move(options))) {}

ApiServer::~ApiServer() {
  stop();
  impl_->engine->stop_background();
}

int ApiServer::bind() {
  Impl& m = *impl_;
  const int http_threads = std::max(1, m.opt.http_threads);
  m.http.new_task_queue = [&m, http_threads] { return m.http.make_task_queue(size_t(http_threads)); };
  if (m.opt.port == 0) {
    m.bound_port = m.http.bind_to_any_port(m.opt.host);
  } else if (m.http.bind_to_port(m.opt.host, m.opt.port)) {
    m.bound_port = m.opt.port;
  }
  if (m.bound_port <= 0)
    LS_THROW << "cannot listen on " << m.opt.host << ":" << m.opt.port << " (address in use or not local?)";
  if (!m.http.widen_backlog()) {
    LS_LOG(Warn) << "serve: could not raise the listen backlog";
  }
  return m.bound_port;
}

int ApiServer::port() const {
  return impl_->bound_port;
}

void ApiServer::serve() {
  Impl& m = *impl_;
  if (m.bound_port <= 0) bind();
  m.engine->start_background();
  m.housekeeper = std::thread([&m] { m.housekeeping_loop(); });
  // Returns after stop(), once the HTTP workers have finished their requests.
  m.http.listen_after_bind();
  {
    std::lock_guard<std::mutex> l(m.state_mu);
    m.finished = true;
  }
  m.state_cv.notify_all();
  m.housekeeper.join();
  // Requests still queued in the engine have no HTTP client left.
  m.abort_all_inflight();
  m.engine->stop_background();
}

void ApiServer::stop() {
  Impl& m = *impl_;
  {
    std::lock_guard<std::mutex> l(m.state_mu);
    const auto now = Clock::now();
    if (m.stopping) {
      m.abort_deadline = now;  // second request: abort at once
    } else {
      m.abort_deadline = now + std::chrono::milliseconds(int64_t(m.opt.shutdown_timeout_s * 1000));
    }
    {
      std::lock_guard<std::mutex> il(m.inflight_mu);
      m.stopping = true;
    }
  }
  m.state_cv.notify_all();
  m.http.stop();
}

}  // namespace lockstep::serve
