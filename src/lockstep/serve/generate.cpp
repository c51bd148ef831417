// The generation endpoints of `lockstep serve` (/generate, /v1/completions,
// /v1/chat/completions): submission to the engine, waiting, and Server-Sent
// Events streaming that never sends broken UTF-8 or text past a stop string.
#include <chrono>
#include <ctime>

#include "lockstep/base/error.h"
#include "lockstep/base/log.h"
#include "lockstep/serve/server_impl.h"

namespace lockstep::serve {

using nlohmann::json;

namespace {

// Incremental text of one streamed sample: ids go through a DecodeStream
// (whole characters only) and text is released only once no stop string can
// still begin inside it.
class TextStreamer {
 public:
  TextStreamer(const tokenizer::Tokenizer* tok, const GenJob& job) : stops_(job.params.stop) {
    if (tok) ds_.emplace(tok->decode_stream(job.skip_special_tokens));
  }
  // New text safe to send after `id`.
  std::string push(int32_t id) {
    if (!ds_ || stopped_) return "";
    all_ += ds_->step(id);
    size_t safe = all_.size() - stop_holdback(all_, stops_);
    if (size_t pos = find_stop(all_, stops_); pos != std::string::npos) {
      safe = std::min(safe, pos);
      stopped_ = true;  // nothing after a stop string is ever sent
    }
    if (safe <= sent_) return "";
    std::string out = all_.substr(sent_, safe - sent_);
    sent_ = safe;
    return out;
  }
  // The part of the final text (finish_sample's) not sent yet.
  std::string rest(const std::string& final_text) const {
    if (final_text.compare(0, sent_, all_, 0, sent_) != 0) {
      LS_LOG(Warn) << "serve: streamed text diverged from the final text; sending the final text's tail only";
      return final_text.size() > sent_ ? final_text.substr(sent_) : "";
    }
    return final_text.substr(sent_);
  }
  std::string sent_text() const { return all_.substr(0, sent_); }

 private:
  std::vector<std::string> stops_;
  std::optional<tokenizer::DecodeStream> ds_;
  std::string all_;
  size_t sent_ = 0;
  bool stopped_ = false;
};

int64_t unix_now() {
  return int64_t(std::time(nullptr));
}

const char* id_prefix(Api api) {
  switch (api) {
    case Api::Generate: return "gen-";
    case Api::Completions: return "cmpl-";
    case Api::Chat: return "chatcmpl-";
  }
  return "";
}

}  // namespace

bool Inflight::all_ready() const {
  for (const auto& fut : futures)
    if (fut.valid() && fut.wait_for(std::chrono::seconds(0)) != std::future_status::ready) return false;
  return true;
}

std::shared_ptr<Inflight> ApiServer::Impl::submit(const GenJob& job, const std::string& rid) {
  auto f = std::make_shared<Inflight>();
  f->streaming = job.stream;
  f->rid = rid;
  const size_t P = job.prompts.size();
  f->ids.assign(P, 0);
  f->abort_sent.assign(P, false);
  {
    std::lock_guard<std::mutex> l(inflight_mu);
    if (stopping) throw HttpError(503, "the server is shutting down", "server_error");
    inflight.insert(f);
  }
  try {
    for (size_t p = 0; p < P; ++p) {
      rollout::Request r;
      r.prompt_ids = job.prompts[p];
      r.params = job.params;
      r.prompt_logprob_start = job.logprob_start;
      // The engine records the routing and the indexer's choices together.
      r.return_experts = job.return_experts || job.return_indexer;
      if (!job.params.stop.empty() && tok())
        r.stop_checker = make_stop_checker(*tok(), job.params.stop, job.skip_special_tokens);
      // Runs on the engine thread under its lock: hand over, nothing more.
      rollout::TokenCallback on_token;
      if (f->streaming)
        on_token = [f, p](uint64_t, int sample, int32_t token, float logprob,
                          const rollout::TopLogprobs& top) {
          std::lock_guard<std::mutex> l(f->mu);
          f->events.push_back({int(p), sample, token, logprob, top});
          f->cv.notify_all();
        };
      uint64_t id = 0;
      auto fut = engine->submit_async(std::move(r), std::move(on_token), &id);
      std::lock_guard<std::mutex> l(f->mu);
      f->ids[p] = id;
      f->futures.push_back(std::move(fut));
    }
  } catch (const Error& e) {
    // Prompts of this request already queued are aborted and drained.
    f->abort_wanted = true;
    wait_all(*f);
    {
      std::lock_guard<std::mutex> l(inflight_mu);
      inflight.erase(f);
    }
    throw HttpError(400, e.what());
  }
  return f;
}

std::vector<rollout::RequestResult> ApiServer::Impl::wait_all(Inflight& f,
                                                              const std::function<bool()>& client_gone) {
  std::vector<rollout::RequestResult> out;
  for (size_t i = 0;; ++i) {
    std::future<rollout::RequestResult>* fut = nullptr;
    {
      std::lock_guard<std::mutex> l(f.mu);
      if (i >= f.futures.size()) break;
      fut = &f.futures[i];
    }
    if (!fut->valid()) continue;
    // Poll so that an abort wanted meanwhile (client gone, shutdown) reaches
    // prompts submitted later too.
    while (fut->wait_for(std::chrono::milliseconds(20)) != std::future_status::ready) {
      if (!f.abort_wanted && client_gone && client_gone()) {
        LS_LOG(Info) << "serve: a client disconnected before its answer; aborting its requests";
        f.abort_wanted = true;
      }
      if (f.abort_wanted) abort_sweep(f);
    }
    out.push_back(fut->get());
  }
  return out;
}

std::vector<SampleOutput> ApiServer::Impl::outputs_of(
    const GenJob& job, const std::vector<rollout::RequestResult>& results) const {
  std::vector<SampleOutput> outs;
  for (const auto& r : results)
    for (const auto& s : r.samples) outs.push_back(finish_sample(tok(), job, s, eos_ids));
  return outs;
}

void ApiServer::Impl::handle_generation(Api api, const httplib::Request& req, httplib::Response& res) {
  json body = parse_body(req);
  const ModelLimits lim = limits();
  GenJob job = api == Api::Generate      ? parse_generate(body, tok(), lim)
               : api == Api::Completions ? parse_completions(body, tok(), lim)
                                         : parse_chat(body, tok(), lim);
  ResponseInfo info{next_id(id_prefix(api)), unix_now()};
  if (!job.rid.empty()) info.id = job.rid;
  std::shared_ptr<Inflight> f = submit(job, info.id);
  auto forget = [this, f] {
    std::lock_guard<std::mutex> l(inflight_mu);
    inflight.erase(f);
  };
  if (!job.stream) {
    std::vector<rollout::RequestResult> results;
    try {
      results = wait_all(*f, [] { return HttpServer::client_gone(); });
    } catch (...) {
      forget();
      throw;
    }
    forget();
    const auto outs = outputs_of(job, results);
    for (const auto& o : outs)
      if (o.openai_finish == "abort") ++requests_aborted;
    set_json(res, 200,
             api == Api::Generate ? generate_response(job, results, outs, tok(), info)
                                  : completions_response(job, results, outs, tok(), info));
    return;
  }
  res.set_header("Cache-Control", "no-cache");
  auto shared_job = std::make_shared<GenJob>(std::move(job));
  res.set_chunked_content_provider(
      "text/event-stream",
      // httplib calls the provider until it calls sink.done(); stream() does
      // the whole response in one call, and false (client gone) cancels.
      [this, shared_job, f, info](size_t, httplib::DataSink& sink) {
        return stream(*shared_job, f, info, sink);
      },
      // Runs when the response is destroyed, also if the provider never ran
      // (the client left before the headers went out): nothing may stay queued.
      [this, f, forget](bool) {
        try {
          if (!f->all_ready()) f->abort_wanted = true;
          wait_all(*f);
        } catch (const std::exception& e) {  // a destructor must not throw
          LS_LOG(Error) << "serve: " << e.what();
        }
        forget();
      });
}

bool ApiServer::Impl::stream(const GenJob& job, const std::shared_ptr<Inflight>& f, const ResponseInfo& info,
                             httplib::DataSink& sink) {
  const size_t P = job.prompts.size();
  const int64_t n = job.params.n;
  const bool chat = job.api == Api::Chat;
  struct SampleState {
    std::optional<TextStreamer> text;
    std::vector<int32_t> ids;
    bool role_sent = false;
  };
  std::vector<SampleState> st(P * size_t(n));
  for (auto& s : st) s.text.emplace(tok(), job);
  bool gone = false;
  auto write = [&](const std::string& s) {
    if (gone) return;
    if (!sink.is_writable() || !sink.write(s.data(), s.size())) gone = true;
  };
  auto openai_chunk = [&](json choice) {
    return json{{"id", info.id},
                {"object", chat ? "chat.completion.chunk" : "text_completion"},
                {"created", info.created},
                {"model", job.model},
                {"choices", json::array({std::move(choice)})}};
  };
  auto delta_for = [&](SampleState& s, const std::string& text) {
    json d = json::object();
    if (!s.role_sent) {
      d["role"] = "assistant";
      s.role_sent = true;
    }
    if (!text.empty() || d.contains("role")) d["content"] = text;
    return d;
  };

  // echo: each choice's first chunk is its prompt's text.
  if (job.api == Api::Completions && job.echo)
    for (size_t k = 0; k < st.size(); ++k)
      write(sse(openai_chunk({{"index", k},
                              {"finish_reason", nullptr},
                              {"text", echo_text(job, job.prompts[k / size_t(n)], tok())},
                              {"logprobs", nullptr}})));
  for (bool done = false; !done && !gone;) {
    std::deque<TokenEvent> batch;
    // Every token event precedes its request's completion (the engine calls
    // back before fulfilling the future), so events taken after seeing all
    // futures ready are the last ones.
    done = f->all_ready();
    {
      std::unique_lock<std::mutex> l(f->mu);
      if (!done && f->events.empty()) f->cv.wait_for(l, std::chrono::milliseconds(50));
      batch.swap(f->events);
    }
    for (const TokenEvent& ev : batch) {
      const size_t k = size_t(ev.prompt) * size_t(n) + size_t(ev.sample);
      SampleState& s = st[k];
      s.ids.push_back(ev.token);
      const std::string delta = s.text->push(ev.token);
      if (job.api == Api::Generate) {
        json meta = {{"id", sample_id(job, info.id, k)},
                     {"finish_reason", nullptr},
                     {"prompt_tokens", job.prompts[size_t(ev.prompt)].size()},
                     {"completion_tokens", s.ids.size()}};
        write(sse({{"text", s.text->sent_text()}, {"output_ids", s.ids}, {"meta_info", meta}, {"index", k}}));
      } else if (!delta.empty() || job.return_logprob || (chat && !s.role_sent)) {
        const std::vector<int32_t> one = {ev.token};
        const std::vector<float> lp = {ev.logprob};
        const std::vector<rollout::TopLogprobs> tops = {ev.top};
        const auto* top = job.params.top_logprobs > 0 ? &tops : nullptr;
        json choice = {{"index", k}, {"finish_reason", nullptr}};
        if (chat) {
          choice["delta"] = delta_for(s, delta);
          choice["logprobs"] =
              job.return_logprob ? chat_logprobs(tok(), one, lp, top, job.tokens_as_ids) : json(nullptr);
        } else {
          choice["text"] = delta;
          choice["logprobs"] = job.return_logprob
                                   ? completions_logprobs(tok(), one, lp, 0, top, job.tokens_as_ids)
                                   : json(nullptr);
        }
        write(sse(openai_chunk(std::move(choice))));
      }
      if (gone) break;
    }
  }
  if (gone) {
    LS_LOG(Info) << "serve: client of " << info.id << " disconnected; aborting its requests";
    f->abort_wanted = true;
    for (const auto& r : wait_all(*f))
      for (const auto& smp : r.samples) requests_aborted += smp.finish_reason == "abort" ? 1 : 0;
    return false;
  }

  const std::vector<rollout::RequestResult> results = wait_all(*f);
  const std::vector<SampleOutput> outs = outputs_of(job, results);
  int64_t prompt_tokens = 0, completion_tokens = 0;
  size_t k = 0;
  for (size_t p = 0; p < results.size(); ++p) {
    prompt_tokens += int64_t(results[p].prompt_ids.size());
    for (size_t j = 0; j < results[p].samples.size(); ++j, ++k) {
      const auto& s = results[p].samples[j];
      completion_tokens += int64_t(s.output_ids.size());
      if (outs[k].openai_finish == "abort") ++requests_aborted;
      if (job.api == Api::Generate) {
        // The last chunk of a sample is its complete non-streaming item.
        json item = generate_item(job, results[p], j, outs[k], tok(), sample_id(job, info.id, k));
        item["index"] = k;
        write(sse(item));
      } else {
        const std::string rest = st[k].text->rest(outs[k].text);
        json choice = {{"index", k}, {"finish_reason", outs[k].openai_finish}, {"logprobs", nullptr}};
        if (outs[k].finish_reason.contains("matched"))
          choice["matched_stop"] = outs[k].finish_reason["matched"];
        if (chat)
          choice["delta"] = rest.empty() && st[k].role_sent ? json::object() : delta_for(st[k], rest);
        else
          choice["text"] = rest;
        write(sse(openai_chunk(std::move(choice))));
      }
    }
  }
  if (job.api != Api::Generate && job.include_usage) {
    json usage_chunk = openai_chunk(json());
    usage_chunk["choices"] = json::array();
    usage_chunk["usage"] = {{"prompt_tokens", prompt_tokens},
                            {"completion_tokens", completion_tokens},
                            {"total_tokens", prompt_tokens + completion_tokens}};
    write(sse(usage_chunk));
  }
  write("data: [DONE]\n\n");
  if (gone) return false;
  sink.done();
  return true;
}

}  // namespace lockstep::serve
