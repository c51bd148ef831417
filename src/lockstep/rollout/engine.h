// The rollout engine: continuous batching over a paged KV cache with shared
// prefixes, seeded sampling, and the log-probability of every sampled token
// (docs/architecture.md sections 3-4). It calls the same model::forward as the trainer,
// so in aligned mode its logprobs equal the trainer's bit for bit.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "lockstep/base/thread_pool.h"
#include "lockstep/model/forward.h"
#include "lockstep/model/weights.h"
#include "lockstep/rollout/block_manager.h"
#include "lockstep/rollout/sampler.h"

namespace lockstep::rollout {

struct EngineConfig {
  int64_t num_blocks = 1024;        // KV blocks (each block_size tokens, all layers)
  int block_size = 16;
  int64_t max_batch_tokens = 2048;  // tokens per forward step (decode + prefill chunks)
  int64_t max_running = 256;        // sequences decoding at once
  int64_t max_prefill_chunk = 512;  // longest prefill chunk of one sequence per step
  bool prefix_cache = true;         // reuse full blocks (prompts, finished samples' sequences) across requests
  uint64_t seed = 0;                // default sampling seed (a request's own seed wins)
  // Keep the KV cache in bf16 when the weights are bf16 or fp8 (half the
  // cache memory and decode traffic). Fast mode only: the trainer's cache is
  // f32, so aligned mode at every precision keeps it in f32 (the default).
  // Chosen when the engine is built.
  bool bf16_kv = false;
  // What update_weights does with requests in flight.
  enum class UpdatePolicy { Finish, Abort } update_policy = UpdatePolicy::Finish;
  // Debug hook (docs/alignment.md, "Localising a divergence"): every forward
  // step hands it its named intermediates; Captured::id(r) is
  // capture_key(request id, sample index) of row r's sample. Empty: off.
  model::CaptureFn capture;
};

// The id a capture hook sees for sample `sample` of request `request_id`.
constexpr uint64_t capture_key(uint64_t request_id, int64_t sample) {
  return (request_id << 24) | uint64_t(sample);
}

struct Request {
  std::vector<int32_t> prompt_ids;
  SamplingParams params;
  // Routed experts of every token in every MoE layer, and for DeepSeek-V4 the
  // indexer's choice of compressed entries in every CSA layer.
  bool return_experts = false;
  // Prompt logprobs: >= 0 reports the logprob (and params.top_logprobs
  // alternatives) of every prompt token from this position on, position 0
  // having none. The prompt is then fed in full (no prefix-cache hits). -1: off.
  int64_t prompt_logprob_start = -1;
  // Teacher forcing: when non-empty, output position i takes forced_output[i]
  // in place of the draw (its logprob is still that of the forward's row, as
  // for a sampled token), and every sample ends after forced_output.size()
  // tokens ("length"; EOS still stops one earlier unless ignore_eos). The
  // tokens are decoded one step at a time, as sampled ones are: a localiser
  // replays a recorded sample through the decode path with it.
  std::vector<int32_t> forced_output;
  // Stop strings need text: called with a sample's output ids, returns the
  // offset in output tokens at which a stop string completes (or -1).
  std::function<int64_t(const std::vector<int32_t>&)> stop_checker;
};

struct SampleResult {
  std::vector<int32_t> output_ids;
  std::vector<float> logprobs;  // one per output token, tempered and untruncated (sampler.h)
  std::vector<TopLogprobs> top_logprobs;  // per output token when params.top_logprobs > 0
  std::string finish_reason;    // "stop", "length" or "abort"
  // (prompt_len + output_len, L_moe, K) when requested. The last output token is
  // never fed to the model; its row repeats the previous token's (harmless:
  // no loss position depends on the last token's layers).
  std::vector<int32_t> routed_experts;
  // DeepSeek-V4 (models with CSA layers), with return_experts: (prompt_len +
  // output_len, L_csa, KI) the compressed entries (block indices, ascending,
  // -1 padding) each token attended to in each CSA layer, the last row
  // repeated like routed_experts'. Empty for other models.
  std::vector<int32_t> indexer_topk;
  uint64_t weight_version = 0;  // weights that produced the first token
  uint64_t weight_version_end = 0;  // ... and the last
  double ttft_s = 0;     // submission to first token
  double latency_s = 0;  // submission to finish
};

struct RequestResult {
  uint64_t id = 0;
  std::vector<int32_t> prompt_ids;
  std::vector<SampleResult> samples;  // n of them
  // With Request::prompt_logprob_start = s >= 0: for prompt positions [s, prompt_len),
  // the logprob of each token given those before it (NaN at position 0, which has
  // none), and its alternatives when params.top_logprobs > 0 (empty at position 0).
  int64_t prompt_logprob_start = -1;
  std::vector<float> prompt_logprobs;
  std::vector<TopLogprobs> prompt_top_logprobs;
};

struct EngineStats {
  int64_t running = 0, waiting = 0;
  int64_t free_blocks = 0, total_blocks = 0;
  int64_t prompt_tokens = 0, generated_tokens = 0;  // totals since start
  int64_t prefix_hit_tokens = 0;                    // prompt tokens served by the prefix cache
  int64_t preemptions = 0;
  int64_t finished_samples = 0;
  int64_t steps = 0;
  double forward_s = 0, sample_s = 0;  // time in forward passes / sampling
};

// Token-level streaming: (request id, sample index, new token id, logprob,
// its top alternatives (empty unless params.top_logprobs > 0)).
using TokenCallback = std::function<void(uint64_t, int, int32_t, float, const TopLogprobs&)>;

class Engine {
 public:
  // `weights` must stay valid until replaced with update_weights. The engine
  // owns its KV cache.
  Engine(const Context& ctx, const model::ModelWeights* weights, EngineConfig config);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Checks the request (prompt length vs context, token ids, params) and
  // throws Error with a message naming the problem; otherwise queues it.
  uint64_t submit(Request request, TokenCallback on_token = {});
  // Runs scheduler steps on the calling thread until `id` (or every request
  // when id == 0) has finished; returns the finished results.
  std::vector<RequestResult> run_until_done(uint64_t id = 0);
  // Convenience: submit all, run, return results in submission order.
  std::vector<RequestResult> generate(std::vector<Request> requests);

  // Background mode: a loop thread serves submissions; the future completes
  // when the request finishes. The loop holds the engine's lock for one step
  // at a time: submit, abort, stats, flush_cache and update_weights called
  // from other threads take it between two steps (a caller waits one step at
  // most), and a request submitted meanwhile joins the next step.
  void start_background();
  void stop_background();
  // `id`, when given, receives the request's id (for abort()).
  std::future<RequestResult> submit_async(Request request, TokenCallback on_token = {},
                                          uint64_t* id = nullptr);

  // Marks a request aborted; at the start of the next step its samples finish
  // with reason "abort", free their KV blocks and draw no further token.
  void abort(uint64_t id);
  // New weights take effect between steps. Policy Finish: in-flight samples
  // continue on the new weights (their weight_version_end tells); Abort: they
  // end with "abort". The prefix cache is flushed either way.
  void update_weights(const model::ModelWeights* weights);
  void flush_cache();

  EngineStats stats() const;
  const EngineConfig& config() const { return config_; }
  const ModelConfig& model_config() const;
  DType kv_dtype() const { return kv_.dtype(); }  // f32, or bf16 in fast mode (bf16_kv)
  uint64_t weight_version() const;
  // The KV cache's allocated memory.
  size_t kv_bytes() const { return kv_.nbytes(); }
  // One scheduler step (exposed for tests); returns false when idle.
  bool step();

 private:
  struct Sequence;
  struct Group;
  struct Chunk;  // one sequence's tokens fed in a step
  struct Draw;   // one token sampled in a step
  uint64_t submit_impl(Request request, TokenCallback on_token, std::promise<RequestResult>* promise);
  // The engine's lock for a caller outside the loop thread: the loop hands it
  // over after its current step (see loop()).
  std::unique_lock<std::mutex> lock_between_steps() const;
  void loop();
  void apply_pending_weights();
  void admit();
  std::vector<int32_t> prefix_hits(const Sequence& s);
  void publish_generated(const Sequence& s);
  bool admit_sample(Sequence& s, std::vector<int32_t> hits, int64_t reserve);
  bool preempt_one(const std::vector<Chunk>& scheduled);
  void readmit_preempted();
  bool ensure_block(Sequence& s);  // a writable slot for the next token
  // The phases of step(), in order.
  std::vector<Chunk> plan();
  model::RaggedBatch build_batch(std::vector<Chunk>& chunks);
  void run_forward(const std::vector<Chunk>& chunks, const model::RaggedBatch& batch, model::ForwardResult* fr);
  void record(const std::vector<Chunk>& chunks, const model::ForwardResult& fr);
  void fork_leaders(std::vector<Chunk>& chunks);
  std::vector<Draw> sample(const std::vector<Chunk>& chunks, const model::ForwardResult& fr);
  void process_draws(std::vector<Draw>& draws);
  void score_draws(std::vector<Draw>& draws);
  void score_prompts(const std::vector<Chunk>& chunks, const model::ForwardResult& fr);
  void apply(const std::vector<Draw>& draws);
  bool stops(Sequence& s, int32_t tok);
  void finish_sample(Sequence& s, const char* reason);
  void release(Sequence& s);
  void complete_finished_groups();
  void check_weights_device(const model::ModelWeights& w) const;

  Context ctx_;
  EngineConfig config_;
  const model::ModelWeights* weights_;
  const model::ModelWeights* pending_weights_ = nullptr;
  model::KvCache kv_;
  model::Workspace ws_;  // forward()'s scratch, kept warm from step to step
  // The last step's logits buffer, lent to the next step's forward: a decode
  // batch of unchanged size writes into the same pages instead of fresh ones.
  OwnedTensor logits_;
  BlockManager blocks_;

  mutable std::mutex mu_;  // guards everything below when a loop thread runs
  std::condition_variable cv_;
  // Callers waiting for mu_ (lock_between_steps): the loop lets them in after
  // each step instead of re-taking the lock at once (std::mutex is not fair).
  mutable std::atomic<int> lock_waiters_{0};
  std::deque<std::unique_ptr<Group>> waiting_;
  std::vector<std::unique_ptr<Group>> active_;
  std::map<uint64_t, RequestResult> finished_;
  std::map<uint64_t, std::promise<RequestResult>> promises_;
  uint64_t next_id_ = 1;
  uint64_t admit_counter_ = 0;
  EngineStats stats_;
  bool flush_requested_ = false;

  std::thread loop_;
  bool stop_ = false;
  bool background_ = false;
};

}  // namespace lockstep::rollout
