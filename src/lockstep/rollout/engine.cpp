// Engine: the scheduler loop. Every sequence is (tokens, n_cached): each step
// feeds tokens[n_cached, ...) — a prefill chunk, a recompute after
// preemption, or the one token of a decode — and when a sequence's fed range
// reaches its end, its last row's logits give the next token. A request's n
// samples start as one leader sequence that prefills the prompt once and
// forks into n sequences sharing the prompt's KV blocks.
#include "lockstep/rollout/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <string_view>

#include "lockstep/base/error.h"
#include "lockstep/base/log.h"
#include "lockstep/base/rng.h"
#include "lockstep/base/timer.h"
#include "lockstep/kernels/cpu/sampling.h"
#include "lockstep/kernels/gpu/backend.h"
#include "lockstep/model/v4_forward.h"
#include "lockstep/rollout/logit_processors.h"

namespace lockstep::rollout {

struct Engine::Sequence {
  Group* group = nullptr;
  int index = 0;                 // sample index within the group
  std::vector<int32_t> tokens;   // prompt + generated
  int64_t n_cached = 0;          // tokens whose KV is in the cache
  std::vector<int32_t> blocks;   // physical KV blocks, in position order
  std::vector<float> logprobs;
  std::vector<TopLogprobs> top;  // per output token, when the request asks for alternatives
  std::vector<int32_t> routes;   // (fed tokens, L_moe, K)
  std::vector<int32_t> indexer;  // (fed tokens, L_csa, KI) DeepSeek-V4's indexer choices
  bool finished = false;
  bool forked = false;           // leader: the other samples exist
  bool running = false;          // admitted (holds blocks)
  uint64_t admit_order = 0;
  std::string reason;
  uint64_t version_first = 0, version_last = 0;
  double t_first = -1, t_end = 0;
};

struct Engine::Group {
  uint64_t id = 0;
  Request req;
  TokenCallback on_token;
  Timer timer;
  uint64_t seed = 0;
  int64_t prompt_len = 0;
  bool aborted = false;
  bool published = false;  // prompt blocks offered to the prefix cache
  // Request::prompt_logprob_start >= 0: per prompt position, the logprob of its
  // token (NaN where none) and its alternatives; scored once the prompt is fed.
  std::vector<float> prompt_lp;
  std::vector<TopLogprobs> prompt_top;
  bool prompt_scored = false;
  std::vector<std::unique_ptr<Sequence>> seqs;
};

// One sequence's share of a step: its tokens[begin, begin + n) are fed.
struct Engine::Chunk {
  Sequence* s = nullptr;
  int64_t begin = 0, n = 0;
  int64_t row0 = 0;        // batch row of tokens[begin]
  int64_t logit_row = -1;  // its row of the logits when the chunk ends at the last token, else -1
  bool forked = false;     // its leader forked into the request's samples this step
  // Prompt logprobs: logits rows [prompt_row0, prompt_row0 + prompt_rows) hold
  // positions [prompt_pos0, ...), each predicting the token after it.
  int64_t prompt_row0 = -1, prompt_pos0 = 0, prompt_rows = 0;
};

// One token to sample this step.
struct Engine::Draw {
  Sequence* s = nullptr;
  const float* row = nullptr;  // (V) the logits it is drawn from
  int32_t tok = 0;
  float logprob = 0.0f;
  // The forward's row, which the logprobs come from; `row` points into
  // `processed` instead when a logit processor reshapes the sampling.
  const float* raw = nullptr;
  std::vector<float> processed{};  // (V)
  TopLogprobs top{};             // params.top_logprobs alternatives
};

namespace {
int64_t blocks_for(int64_t tokens, int bs) { return (tokens + bs - 1) / bs; }

// bf16 K/V with bf16/fp8 weights when asked (EngineConfig::bf16_kv), else f32.
// DeepSeek-V4's stores stay f32 (its window and compressed entries share one
// store; a bf16 form of it is not implemented).
DType choose_kv_dtype(const model::ModelWeights& w, const EngineConfig& c) {
  return w.storage() != DType::F32 && c.bf16_kv && !w.config().is_v4() ? DType::BF16 : DType::F32;
}

// A sequence's per-token record (routes, indexer choices; `row` ints a token)
// takes the batch rows [row0, row0 + n) of `batch` as its tokens [begin,
// begin + n); a recompute after preemption re-records positions already known.
void record_rows(std::vector<int32_t>& seq, const std::vector<int32_t>& batch, int64_t begin, int64_t row0,
                 int64_t n, int64_t row) {
  seq.resize(size_t(begin * row));
  seq.insert(seq.end(), batch.begin() + row0 * row, batch.begin() + (row0 + n) * row);
}

// The record of a finished sequence of `tokens` tokens: the last token was
// never fed, so its row repeats the previous one (see engine.h).
std::vector<int32_t> rows_per_token(std::vector<int32_t> rec, size_t tokens, size_t row) {
  rec.resize(std::min(rec.size(), tokens * row));
  while (rec.size() < tokens * row && rec.size() >= row)
    rec.insert(rec.end(), rec.end() - int64_t(row), rec.end());
  return rec;
}
}  // namespace

Engine::Engine(const Context& ctx, const model::ModelWeights* weights, EngineConfig config)
    : ctx_(ctx),
      config_(config),
      weights_(weights),
      kv_(weights->config(), config.num_blocks, config.block_size, choose_kv_dtype(*weights, config),
          kernels::device_memory(ctx), /*with_mtp=*/false),
      ws_(kernels::device_memory(ctx)),
      blocks_(config.num_blocks, config.block_size) {
  LS_CHECK(config.max_batch_tokens >= 1 && config.max_running >= 1 && config.max_prefill_chunk >= 1)
      << "engine limits must be >= 1";
  check_weights_device(*weights);
  stats_.total_blocks = config.num_blocks;
}

Engine::~Engine() { stop_background(); }

const ModelConfig& Engine::model_config() const { return weights_->config(); }

std::unique_lock<std::mutex> Engine::lock_between_steps() const {
  lock_waiters_.fetch_add(1);
  std::unique_lock<std::mutex> l(mu_);
  lock_waiters_.fetch_sub(1);
  return l;
}

uint64_t Engine::weight_version() const {
  const auto l = lock_between_steps();
  return weights_->version();
}

uint64_t Engine::submit(Request req, TokenCallback on_token) {
  return submit_impl(std::move(req), std::move(on_token), nullptr);
}

uint64_t Engine::submit_impl(Request req, TokenCallback on_token, std::promise<RequestResult>* promise) {
  const ModelConfig& c = weights_->config();
  req.params.validate();
  if (req.prompt_ids.empty()) LS_THROW << "the prompt is empty";
  for (int32_t t : req.prompt_ids)
    if (t < 0 || t >= c.vocab_size) LS_THROW << "prompt token id " << t << " is outside [0, " << c.vocab_size << ")";
  const int64_t len = int64_t(req.prompt_ids.size());
  if (len >= c.max_position_embeddings)
    LS_THROW << "the prompt has " << len << " tokens; the model's context is " << c.max_position_embeddings;
  if (blocks_for(len + 1, config_.block_size) > config_.num_blocks)
    LS_THROW << "the prompt needs " << blocks_for(len + 1, config_.block_size) << " KV blocks; the engine has "
             << config_.num_blocks;
  if (!req.params.stop.empty() && !req.stop_checker)
    LS_THROW << "stop strings need a tokenizer (none was given to this request)";
  for (const auto& [t, bias] : req.params.logit_bias)
    if (t >= c.vocab_size) LS_THROW << "logit_bias: token id " << t << " is outside [0, " << c.vocab_size << ")";
  if (req.prompt_logprob_start < -1 || req.prompt_logprob_start >= len)
    LS_THROW << "the prompt logprob start " << req.prompt_logprob_start << " is outside [-1, " << len << ")";
  for (int32_t t : req.forced_output)
    if (t < 0 || t >= c.vocab_size) LS_THROW << "forced token id " << t << " is outside [0, " << c.vocab_size << ")";
  auto g = std::make_unique<Group>();
  g->req = std::move(req);
  g->on_token = std::move(on_token);
  g->prompt_len = len;
  if (g->req.prompt_logprob_start >= 0) {
    g->prompt_lp.assign(size_t(len), std::numeric_limits<float>::quiet_NaN());
    g->prompt_top.assign(size_t(len), {});
  }
  const auto l = lock_between_steps();
  g->id = next_id_++;
  g->seed = g->req.params.seed >= 0 ? uint64_t(g->req.params.seed) : mix_seed(config_.seed, g->id);
  auto s = std::make_unique<Sequence>();
  s->group = g.get();
  s->tokens = g->req.prompt_ids;
  g->seqs.push_back(std::move(s));
  const uint64_t id = g->id;
  if (promise) promises_.emplace(id, std::move(*promise));
  waiting_.push_back(std::move(g));
  cv_.notify_all();
  return id;
}

void Engine::abort(uint64_t id) {
  const auto l = lock_between_steps();
  for (auto& g : waiting_)
    if (g->id == id) g->aborted = true;
  for (auto& g : active_)
    if (g->id == id) g->aborted = true;
  cv_.notify_all();
}

// The kernels read the weights where the engine's device can: weights built
// with another device's context would hand them host pointers.
void Engine::check_weights_device(const model::ModelWeights& w) const {
  const Allocator& memory = kernels::device_memory(ctx_);
  LS_CHECK(memory.holds(w.flat()))
      << "rollout engine on the " << memory.name()
      << " device: its weights are not in that device's memory (build the ModelWeights with the engine's context)";
}

void Engine::update_weights(const model::ModelWeights* w) {
  check_weights_device(*w);
  LS_CHECK(w != nullptr) << "null weights";
  LS_CHECK(ParamLayout(w->config()).same_as(ParamLayout(weights_->config())))
      << "update_weights: the new weights have a different architecture";
  const auto l = lock_between_steps();
  pending_weights_ = w;
  cv_.notify_all();
}

void Engine::flush_cache() {
  const auto l = lock_between_steps();
  flush_requested_ = true;
}

EngineStats Engine::stats() const {
  const auto l = lock_between_steps();
  EngineStats s = stats_;
  s.free_blocks = blocks_.available();
  s.waiting = 0;
  s.running = 0;
  for (const auto& g : waiting_) s.waiting += int64_t(g->req.params.n);
  for (const auto& g : active_)
    for (const auto& q : g->seqs) s.running += q->running && !q->finished ? 1 : 0;
  return s;
}

void Engine::release(Sequence& s) {
  for (int32_t b : s.blocks) blocks_.release(b);
  s.blocks.clear();
  s.running = false;
}

void Engine::finish_sample(Sequence& s, const char* reason) {
  if (s.finished) return;
  s.finished = true;
  s.reason = reason;
  ++stats_.finished_samples;
  s.t_end = s.group->timer.seconds();
  if (std::string_view(reason) != "abort") publish_generated(s);
  release(s);
}

// A finished sample's full blocks, generated tokens included, go to the prefix
// cache: a request that continues its sequence (the next turn of a multi-turn
// episode: the history plus an observation) is served from them. The KV of a
// decoded token has the bits a prefill of it would have (batch-invariant
// kernels), so a hit changes no result.
void Engine::publish_generated(const Sequence& s) {
  if (!config_.prefix_cache || !s.running || s.group->req.return_experts) return;
  const int bs = config_.block_size;
  uint64_t parent = 0;
  for (int64_t b = 0; (b + 1) * bs <= s.n_cached && b < int64_t(s.blocks.size()); ++b) {
    const int32_t* toks = s.tokens.data() + b * bs;
    const uint64_t key = BlockManager::chain_hash(parent, toks, bs);
    blocks_.insert(s.blocks[size_t(b)], key, parent, toks);
    parent = key;
  }
}

void Engine::apply_pending_weights() {
  if (pending_weights_ != nullptr) {
    if (config_.update_policy == EngineConfig::UpdatePolicy::Abort) {
      // In flight: every active group, and a queued one that has drawn tokens
      // already (preempted as a whole); queued fresh requests start on the new weights.
      for (auto& g : active_) g->aborted = true;
      for (auto& g : waiting_)
        for (const auto& q : g->seqs) g->aborted = g->aborted || q->t_first >= 0;
    }
    weights_ = pending_weights_;
    pending_weights_ = nullptr;
    flush_requested_ = true;
  }
  if (flush_requested_) {
    blocks_.flush();
    flush_requested_ = false;
  }
}

// Prefix cache: the blocks already holding full blocks of s's tokens[0, len-1)
// (at least one token must be fed to get logits), retained for s. Routing
// capture needs every token fed, so it gets none.
std::vector<int32_t> Engine::prefix_hits(const Sequence& s) {
  std::vector<int32_t> hits;
  if (!config_.prefix_cache || s.group->req.return_experts || s.group->req.prompt_logprob_start >= 0) return hits;
  const int bs = config_.block_size;
  const int64_t len = int64_t(s.tokens.size());
  uint64_t parent = 0;
  for (int64_t b = 0; (b + 1) * bs <= len - 1; ++b) {
    const int32_t* toks = s.tokens.data() + b * bs;
    const uint64_t key = BlockManager::chain_hash(parent, toks, bs);
    auto hit = blocks_.lookup(key, parent, toks);
    if (!hit) break;
    hits.push_back(*hit);
    parent = key;
  }
  return hits;
}

// The one way a sample gets KV blocks and joins the running set: `hits` (its
// prefix-cache blocks, already retained) plus fresh blocks for the rest of its
// tokens, if `reserve` blocks stay free afterwards; otherwise the hits are
// released and it stays idle. It is fed from the first uncached token.
bool Engine::admit_sample(Sequence& s, std::vector<int32_t> hits, int64_t reserve) {
  const int bs = config_.block_size;
  const int64_t need = blocks_for(int64_t(s.tokens.size()), bs) - int64_t(hits.size());
  if (blocks_.available() < need + reserve) {
    for (int32_t b : hits) blocks_.release(b);
    return false;
  }
  s.n_cached = int64_t(hits.size()) * bs;
  s.blocks = std::move(hits);
  for (int64_t i = 0; i < need; ++i) s.blocks.push_back(*blocks_.allocate());
  stats_.prefix_hit_tokens += s.n_cached;
  s.running = true;
  s.admit_order = ++admit_counter_;
  return true;
}

// Admits waiting groups first-come first-served while their prefill fits. A
// group preempted as a whole is at the front of the queue and comes back here
// like a new request.
void Engine::admit() {
  int64_t running = 0;
  for (const auto& g : active_)
    for (const auto& q : g->seqs) running += (q->running && !q->finished) ? 1 : 0;
  while (!waiting_.empty()) {
    Group& g = *waiting_.front();
    if (g.aborted) {
      for (auto& q : g.seqs) finish_sample(*q, "abort");
      active_.push_back(std::move(waiting_.front()));
      waiting_.pop_front();
      continue;
    }
    // The sequences of this group that still need admission (a fresh leader, or
    // samples preempted earlier).
    std::vector<Sequence*> todo;
    for (auto& q : g.seqs)
      if (!q->finished && !q->running) todo.push_back(q.get());
    if (todo.empty()) {  // nothing left to admit (should not happen)
      active_.push_back(std::move(waiting_.front()));
      waiting_.pop_front();
      continue;
    }
    const bool fresh = todo.size() == 1 && !todo[0]->forked && todo[0] == g.seqs[0].get() && g.seqs.size() == 1;
    const int64_t n_after = fresh ? g.req.params.n : int64_t(todo.size());
    if (running > 0 && running + n_after > config_.max_running) break;
    bool admitted_all = true;
    int64_t admitted = 0;
    for (Sequence* s : todo) {
      std::vector<int32_t> hits = prefix_hits(*s);
      const int64_t need = blocks_for(int64_t(s->tokens.size()), config_.block_size) - int64_t(hits.size());
      if (running == 0 && need > blocks_.available()) {
        // Even an empty engine cannot hold this sample's KV any more (it grew
        // past the cache while decoding): end it as truncated.
        for (int32_t b : hits) blocks_.release(b);
        LS_LOG(Warn) << "request " << g.id << " sample " << s->index << ": " << s->tokens.size()
                     << " tokens no longer fit the KV cache; finished with reason 'length'";
        finish_sample(*s, "length");
        continue;
      }
      // Keep one block per running sequence in reserve so decodes can proceed.
      if (!admit_sample(*s, std::move(hits), running)) {
        admitted_all = false;
        break;
      }
      ++running;
      ++admitted;
    }
    // Samples admitted here hold blocks and must be scheduled, and only active
    // groups are: a partly admitted group becomes active, and
    // readmit_preempted() brings the rest in as blocks free up. (Left in the
    // queue, its admitted samples held blocks without running: a deadlock, or
    // samples cut short as if the cache were too small.)
    if (!admitted_all && admitted == 0) break;
    active_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
    if (!admitted_all) break;
  }
}

// Makes position n_cached of s writable: a block exists and is not shared.
bool Engine::ensure_block(Sequence& s) {
  const int bs = config_.block_size;
  const int64_t b = s.n_cached / bs;
  if (b < int64_t(s.blocks.size())) {
    const int32_t blk = s.blocks[size_t(b)];
    if (blocks_.refcount(blk) == 1) return true;
    // Copy on write: the block is shared with sibling samples.
    auto fresh = blocks_.allocate();
    if (!fresh) return false;
    kv_.copy_block(*fresh, blk);
    blocks_.release(blk);
    s.blocks[size_t(b)] = *fresh;
    return true;
  }
  auto fresh = blocks_.allocate();
  if (!fresh) return false;
  s.blocks.push_back(*fresh);
  return true;
}

// Preemption: frees the KV of the most recently admitted running sample not
// already scheduled this step (false if there is none); it is recomputed from
// position 0 once re-admitted. The rule for coming back: a group with no
// running sample left goes to the front of the queue and admit() takes it like
// a new request (prefix cache and max_running included); a sample whose
// siblings still run stays in its active group and readmit_preempted() brings
// it back. Both end in admit_sample().
bool Engine::preempt_one(const std::vector<Chunk>& scheduled) {
  Sequence* victim = nullptr;
  auto later = [](const Sequence* a, const Sequence* b) {
    if (a->admit_order != b->admit_order) return a->admit_order > b->admit_order;
    if (a->group->id != b->group->id) return a->group->id > b->group->id;
    return a->index > b->index;
  };
  for (auto& g : active_)
    for (auto& q : g->seqs) {
      if (!q->running || q->finished) continue;
      if (std::any_of(scheduled.begin(), scheduled.end(), [&](const Chunk& w) { return w.s == q.get(); })) continue;
      if (!victim || later(q.get(), victim)) victim = q.get();
    }
  if (!victim) return false;
  release(*victim);
  victim->n_cached = 0;
  ++stats_.preemptions;
  Group* vg = victim->group;
  const bool any_running =
      std::any_of(vg->seqs.begin(), vg->seqs.end(), [](const auto& q) { return q->running && !q->finished; });
  if (!any_running) {
    auto it = std::find_if(active_.begin(), active_.end(), [&](const auto& g) { return g.get() == vg; });
    LS_CHECK(it != active_.end()) << "a running sample's group is not active";
    waiting_.push_front(std::move(*it));
    active_.erase(it);
  }
  return true;
}

// Re-admission of the idle samples of active groups (preempted while siblings
// kept running, or left out when their group was admitted in part): each comes
// back as soon as all its KV fits with one block to spare.
void Engine::readmit_preempted() {
  for (auto& g : active_)
    for (auto& q : g->seqs)
      if (!q->finished && !q->running) admit_sample(*q, {}, 1);
}

// Phase 1: aborts the requests marked since the last step, chooses each
// running sequence's chunk under the token budget (decodes first, then prefill
// and recompute chunks, in admission order), then re-admits preempted samples
// for the next step.
std::vector<Engine::Chunk> Engine::plan() {
  for (auto& g : active_)
    if (g->aborted)
      for (auto& q : g->seqs) finish_sample(*q, "abort");
  std::vector<Sequence*> runnable;
  for (auto& g : active_)
    for (auto& q : g->seqs)
      if (q->running && !q->finished) runnable.push_back(q.get());
  std::sort(runnable.begin(), runnable.end(), [](const Sequence* a, const Sequence* b) {
    if (a->admit_order != b->admit_order) return a->admit_order < b->admit_order;
    if (a->group->id != b->group->id) return a->group->id < b->group->id;
    return a->index < b->index;
  });
  std::vector<Chunk> chunks;
  int64_t budget = config_.max_batch_tokens;
  // Decodes (exactly one token to feed); a decode without a writable block
  // preempts another sample, or waits a step when none can be preempted.
  for (Sequence* s : runnable) {
    if (int64_t(s->tokens.size()) - s->n_cached != 1 || !s->running) continue;
    if (budget <= 0) break;
    while (s->running && !ensure_block(*s))
      if (!preempt_one(chunks)) break;
    if (!s->running) continue;
    if (int64_t(s->blocks.size()) <= s->n_cached / config_.block_size) continue;
    chunks.push_back({s, s->n_cached, 1});
    budget -= 1;
  }
  // Prefill and recompute chunks, first come first served.
  for (Sequence* s : runnable) {
    const int64_t left = int64_t(s->tokens.size()) - s->n_cached;
    if (!s->running || left <= 1 || budget <= 0) continue;
    const int64_t n = std::min({left, budget, config_.max_prefill_chunk});
    chunks.push_back({s, s->n_cached, n});
    budget -= n;
  }
  readmit_preempted();
  return chunks;
}

// Phase 2: the ragged batch of the chunks, in order; a chunk that reaches the
// end of its tokens asks for the logits of its last row.
model::RaggedBatch Engine::build_batch(std::vector<Chunk>& chunks) {
  const int bs = config_.block_size;
  int32_t max_blocks = 1;
  for (const Chunk& w : chunks) max_blocks = std::max<int32_t>(max_blocks, int32_t(blocks_for(w.begin + w.n, bs)));
  model::RaggedBatch batch(max_blocks);
  int64_t n_logits = 0;
  for (Chunk& w : chunks) {
    const int64_t nb = blocks_for(w.begin + w.n, bs);
    // Prefill blocks were allocated at admission; a recompute or decode may need more.
    while (int64_t(w.s->blocks.size()) < nb) {
      auto b = blocks_.allocate();
      LS_CHECK(b.has_value()) << "KV blocks exhausted while scheduling a chunk";
      w.s->blocks.push_back(*b);
    }
    w.row0 = batch.add_sequence(w.s->tokens.data() + w.begin, int32_t(w.n), int32_t(w.begin), w.s->blocks.data(),
                                int32_t(nb));
    // Prompt logprobs: the rows of prompt positions [max(start, 1) - 1, prompt_len - 1)
    // in this chunk (the last prompt position's row is the first draw's).
    const Group& g = *w.s->group;
    if (g.req.prompt_logprob_start >= 0 && !g.prompt_scored && w.s->index == 0) {
      const int64_t lo = std::max(w.begin, std::max<int64_t>(g.req.prompt_logprob_start, 1) - 1);
      const int64_t hi = std::min(w.begin + w.n, g.prompt_len - 1);
      if (hi > lo) {
        w.prompt_row0 = n_logits;
        w.prompt_pos0 = lo;
        w.prompt_rows = hi - lo;
        for (int64_t p = lo; p < hi; ++p) batch.logit_rows.push_back(int32_t(w.row0 + p - w.begin));
        n_logits += hi - lo;
      }
    }
    if (w.begin + w.n == int64_t(w.s->tokens.size())) {
      w.logit_row = n_logits++;
      batch.logit_rows.push_back(int32_t(w.row0 + w.n - 1));
    }
  }
  return batch;
}

// Phase 3: the forward pass, recording routed experts (and DeepSeek-V4's
// indexer choices) when a request asks.
void Engine::run_forward(const std::vector<Chunk>& chunks, const model::RaggedBatch& batch,
                         model::ForwardResult* fr) {
  bool want_routes = false;
  for (const Chunk& w : chunks) want_routes = want_routes || w.s->group->req.return_experts;
  model::ForwardOptions fo;
  fo.record_experts = want_routes && weights_->config().num_moe_layers() > 0;
  fo.record_indexer = want_routes && model::num_csa_layers(weights_->config()) > 0;
  std::vector<uint64_t> capture_ids;
  if (config_.capture) {
    for (const Chunk& w : chunks) capture_ids.push_back(capture_key(w.s->group->id, w.s->index));
    fo.capture = &config_.capture;
    fo.capture_ids = &capture_ids;
  }
  Timer fwd;
  model::forward(ctx_, *weights_, kv_, ws_, batch, fo, fr);
  stats_.forward_s += fwd.seconds();
  ++stats_.steps;
}

// Phase 4: what the forward wrote: the chunks' KV is cached, their routed
// experts are kept, and a prompt whose prefill is complete offers its full
// blocks to the prefix cache (once per request).
void Engine::record(const std::vector<Chunk>& chunks, const model::ForwardResult& fr) {
  const ModelConfig& c = weights_->config();
  const int bs = config_.block_size;
  const int64_t route_row = c.num_moe_layers() * c.num_experts_per_tok;
  const int64_t indexer_row = model::num_csa_layers(c) * c.index_topk;
  for (const Chunk& w : chunks) {
    Sequence& s = *w.s;
    s.n_cached += w.n;
    if (!s.group->req.return_experts) continue;
    if (route_row > 0) record_rows(s.routes, fr.routed_experts, w.begin, w.row0, w.n, route_row);
    if (indexer_row > 0) record_rows(s.indexer, fr.indexer_topk, w.begin, w.row0, w.n, indexer_row);
  }
  for (const Chunk& w : chunks) {
    Sequence& s = *w.s;
    Group& g = *s.group;
    if (!config_.prefix_cache || g.published || s.index != 0 || s.n_cached < g.prompt_len) continue;
    uint64_t parent = 0;
    for (int64_t b = 0; (b + 1) * bs <= g.prompt_len; ++b) {
      const int32_t* toks = g.req.prompt_ids.data() + b * bs;
      const uint64_t key = BlockManager::chain_hash(parent, toks, bs);
      blocks_.insert(s.blocks[size_t(b)], key, parent, toks);
      parent = key;
    }
    g.published = true;
  }
}

// Phase 5: a leader about to draw its request's first token forks into the n
// samples, which share the prompt's KV blocks (copy on write) and draw too.
void Engine::fork_leaders(std::vector<Chunk>& chunks) {
  for (Chunk& w : chunks) {
    Sequence& lead = *w.s;
    Group& g = *lead.group;
    if (w.logit_row < 0 || lead.forked || lead.index != 0 || int64_t(lead.tokens.size()) != g.prompt_len) continue;
    lead.forked = true;
    w.forked = true;
    for (int64_t k = 1; k < g.req.params.n; ++k) {
      auto q = std::make_unique<Sequence>();
      q->group = &g;
      q->index = int(k);
      q->tokens = lead.tokens;
      q->n_cached = lead.n_cached;
      q->blocks = lead.blocks;
      for (int32_t b : q->blocks) blocks_.retain(b);
      q->routes = lead.routes;
      q->indexer = lead.indexer;
      q->forked = true;
      q->running = true;
      q->admit_order = lead.admit_order;
      g.seqs.push_back(std::move(q));
    }
  }
}

// Phase 6: one draw per live sequence of each chunk with logits, in chunk
// order (a just-forked leader's samples in index order); the choices are one
// sampling-kernel call, each a pure function of its row, its params and its
// random number (Philox at the sample's stream and position).
std::vector<Engine::Draw> Engine::sample(const std::vector<Chunk>& chunks, const model::ForwardResult& fr) {
  const int64_t V = weights_->config().vocab_size;
  std::vector<Draw> draws;
  std::vector<kernels::SampleSpec> specs;  // one per draw
  for (const Chunk& w : chunks) {
    if (w.logit_row < 0) continue;
    Group& g = *w.s->group;
    const float* row = fr.logits.f32() + w.logit_row * V;
    auto draw = [&](Sequence* s) {
      if (s->finished) return;
      draws.push_back({s, row});
      specs.push_back(sample_spec(g.req.params, g.seed, s->index, int64_t(s->tokens.size()), w.logit_row));
    };
    if (w.forked) {
      for (auto& q : g.seqs) draw(q.get());
    } else {
      draw(w.s);
    }
  }
  process_draws(draws);
  // The choices: one kernel call, each a pure function of its row and spec.
  // Draws from a processed row (logit processors) read a batch of their own
  // rows instead of the forward's.
  const Allocator& memory = kernels::device_memory(ctx_);
  Buffer own_rows;
  Tensor logits = fr.logits.view();
  if (std::any_of(draws.begin(), draws.end(), [](const Draw& d) { return !d.processed.empty(); })) {
    own_rows = Buffer(draws.size() * size_t(V) * sizeof(float), memory, Fill::Undefined, "processed logits");
    for (size_t i = 0; i < draws.size(); ++i) {
      float* dst = own_rows.as<float>() + int64_t(i) * V;
      if (draws[i].processed.empty()) {
        memory.copy(dst, draws[i].raw, size_t(V) * sizeof(float));
      } else {
        memory.copy_in(dst, draws[i].processed.data(), size_t(V) * sizeof(float));
      }
      specs[i].logit_row = int64_t(i);
    }
    logits = Tensor(own_rows.data(), DType::F32, {int64_t(draws.size()), V});
  }
  std::vector<int32_t> toks(draws.size());
  if (!draws.empty()) {
    Buffer chosen(toks.size() * sizeof(int32_t), memory, Fill::Undefined, "sampled tokens");
    kernels::sample_rows(ctx_, Tensor(chosen.data(), DType::I32, {int64_t(toks.size())}), logits, specs);
    memory.copy_out(toks.data(), chosen.data(), chosen.size());
  }
  for (size_t i = 0; i < draws.size(); ++i) {
    const Sequence& s = *draws[i].s;
    const std::vector<int32_t>& forced = s.group->req.forced_output;
    const size_t out_pos = s.tokens.size() - size_t(s.group->prompt_len);
    draws[i].tok = out_pos < forced.size() ? forced[out_pos] : toks[i];
  }
  score_draws(draws);
  return draws;
}

// Logit processors (logit_processors.h): a draw whose request reshapes its
// sampling distribution is drawn from a processed copy of its row; its
// logprobs still come from the forward's row.
void Engine::process_draws(std::vector<Draw>& draws) {
  const int64_t V = weights_->config().vocab_size;
  const std::vector<int64_t>& eos = weights_->config().eos_token_ids;
  for (Draw& d : draws) d.raw = d.row;
  ctx_.parallel_for(int64_t(draws.size()), [&](int64_t b0, int64_t b1) {
    for (int64_t i = b0; i < b1; ++i) {
      Draw& d = draws[size_t(i)];
      const Group& g = *d.s->group;
      if (!g.req.params.processes_logits()) continue;
      d.processed.assign(d.raw, d.raw + V);
      process_logits(d.processed.data(), V, g.req.params, {&d.s->tokens, g.prompt_len, &eos});
      d.row = d.processed.data();
    }
  });
}

namespace {
// The rows `rows` (each (V), in `memory`) copied into one (R, V) buffer there.
Buffer gather_rows(const Allocator& memory, const std::vector<const float*>& rows, int64_t V) {
  Buffer out(rows.size() * size_t(V) * sizeof(float), memory, Fill::Undefined, "draw logits");
  for (size_t j = 0; j < rows.size(); ++j) memory.copy(out.as<float>() + j * V, rows[j], size_t(V) * sizeof(float));
  return out;
}
}  // namespace

// The draws' logprobs, and alternatives for the requests that ask: one kernel
// call per logprob temperature over the draws' forward rows (per-row results:
// the same bits as one call per row).
void Engine::score_draws(std::vector<Draw>& draws) {
  const int64_t V = weights_->config().vocab_size;
  std::vector<float> temps;
  for (const Draw& d : draws) {
    const float t = d.s->group->req.params.logprob_temperature();
    if (std::find(temps.begin(), temps.end(), t) == temps.end()) temps.push_back(t);
  }
  for (float t : temps) {
    std::vector<size_t> which, asking;
    std::vector<const float*> rows, asking_rows;
    std::vector<int32_t> toks;
    int64_t k = 0;
    for (size_t i = 0; i < draws.size(); ++i) {
      const SamplingParams& p = draws[i].s->group->req.params;
      if (p.logprob_temperature() != t) continue;
      const float* raw = draws[i].raw ? draws[i].raw : draws[i].row;
      which.push_back(i);
      rows.push_back(raw);
      toks.push_back(draws[i].tok);
      if (p.top_logprobs > 0) {
        asking.push_back(i);
        asking_rows.push_back(raw);
        k = std::max(k, p.top_logprobs);
      }
    }
    // Rows that already lie one after another (a decode batch without logit
    // processors reads the forward's rows in order) are scored in place.
    Buffer all;
    const float* first = rows.front();
    for (size_t j = 0; j < rows.size() && first != nullptr; ++j)
      if (rows[j] != rows.front() + int64_t(j) * V) first = nullptr;
    if (first == nullptr) {
      all = gather_rows(kernels::device_memory(ctx_), rows, V);  // (R, V)
      first = all.as<float>();
    }
    const Tensor scored(const_cast<float*>(first), DType::F32, {int64_t(rows.size()), V});  // (R, V)
    std::vector<float> lp;
    token_logprobs(ctx_, scored, toks, t, &lp);
    for (size_t j = 0; j < which.size(); ++j) draws[which[j]].logprob = lp[j];
    if (asking.empty()) continue;
    Buffer ask = gather_rows(kernels::device_memory(ctx_), asking_rows, V);  // (A, V)
    std::vector<TopLogprobs> top;
    top_logprobs(ctx_, Tensor(ask.as<float>(), DType::F32, {int64_t(asking.size()), V}), k, t, &top);
    for (size_t j = 0; j < asking.size(); ++j) {
      Draw& d = draws[asking[j]];
      top[j].resize(size_t(d.s->group->req.params.top_logprobs));
      d.top = std::move(top[j]);
    }
  }
}

// Prompt logprobs of the chunks that asked for them (build_batch): the same
// kernel calls over the forward's rows of the prompt positions, each row
// scoring the token after it.
void Engine::score_prompts(const std::vector<Chunk>& chunks, const model::ForwardResult& fr) {
  const int64_t V = weights_->config().vocab_size;
  for (const Chunk& w : chunks) {
    Group& g = *w.s->group;
    if (g.req.prompt_logprob_start < 0 || g.prompt_scored || w.s->index != 0) continue;
    if (w.prompt_rows > 0) {
      const Tensor rows(fr.logits.f32() + w.prompt_row0 * V, DType::F32, {w.prompt_rows, V});
      std::vector<int32_t> targets;
      for (int64_t p = w.prompt_pos0; p < w.prompt_pos0 + w.prompt_rows; ++p)
        targets.push_back(w.s->tokens[size_t(p + 1)]);
      const SamplingParams& sp = g.req.params;
      std::vector<float> lp;
      token_logprobs(ctx_, rows, targets, sp.logprob_temperature(), &lp);
      std::vector<TopLogprobs> top;
      top_logprobs(ctx_, rows, sp.top_logprobs, sp.logprob_temperature(), &top);
      for (int64_t j = 0; j < w.prompt_rows; ++j) {
        g.prompt_lp[size_t(w.prompt_pos0 + j + 1)] = lp[size_t(j)];
        if (sp.top_logprobs > 0) g.prompt_top[size_t(w.prompt_pos0 + j + 1)] = std::move(top[size_t(j)]);
      }
    }
    if (w.begin + w.n >= g.prompt_len) g.prompt_scored = true;
  }
}

// Phase 7, in draw order: append each token, stream it, and finish samples
// that stopped or reached their length.
void Engine::apply(const std::vector<Draw>& draws) {
  const ModelConfig& c = weights_->config();
  for (const Draw& d : draws) {
    Sequence& s = *d.s;
    Group& g = *s.group;
    const SamplingParams& p = g.req.params;
    s.tokens.push_back(d.tok);
    s.logprobs.push_back(d.logprob);
    if (p.top_logprobs > 0) s.top.push_back(d.top);
    if (s.t_first < 0) {
      s.t_first = g.timer.seconds();
      s.version_first = weights_->version();
    }
    s.version_last = weights_->version();
    stats_.generated_tokens += 1;
    if (g.on_token) g.on_token(g.id, s.index, d.tok, d.logprob, d.top);
    const int64_t out_len = int64_t(s.tokens.size()) - g.prompt_len;
    if (stops(s, d.tok)) {
      finish_sample(s, "stop");
    } else if (out_len >= p.max_new_tokens || int64_t(s.tokens.size()) >= c.max_position_embeddings ||
               (!g.req.forced_output.empty() && out_len >= int64_t(g.req.forced_output.size()))) {
      finish_sample(s, "length");
    }
  }
}

// Whether s stops at its new token `tok`: EOS, a stop token, or a stop string
// (which cuts the output where the string completes).
bool Engine::stops(Sequence& s, int32_t tok) {
  const Group& g = *s.group;
  const SamplingParams& p = g.req.params;
  // Before min_new_tokens nothing stops a sample (EOS and stop tokens are masked too).
  if (int64_t(s.tokens.size()) - g.prompt_len < p.min_new_tokens) return false;
  bool stop = false;
  if (!p.ignore_eos)
    for (int64_t e : weights_->config().eos_token_ids) stop = stop || tok == int32_t(e);
  for (int32_t e : p.stop_token_ids) stop = stop || tok == e;
  if (!stop && g.req.stop_checker) {
    std::vector<int32_t> out(s.tokens.begin() + g.prompt_len, s.tokens.end());
    const int64_t cut = g.req.stop_checker(out);
    if (cut >= 0) {
      s.tokens.resize(size_t(g.prompt_len + cut));
      s.logprobs.resize(size_t(cut));
      if (!s.top.empty()) s.top.resize(size_t(cut));
      stop = true;
    }
  }
  return stop;
}

bool Engine::step() {
  apply_pending_weights();
  admit();
  std::vector<Chunk> chunks = plan();
  if (chunks.empty()) {
    complete_finished_groups();
    return !waiting_.empty() || !active_.empty();
  }
  const model::RaggedBatch batch = build_batch(chunks);
  model::ForwardResult fr;
  fr.logits = std::move(logits_);
  run_forward(chunks, batch, &fr);
  record(chunks, fr);
  score_prompts(chunks, fr);
  Timer sampling;
  fork_leaders(chunks);
  const std::vector<Draw> draws = sample(chunks, fr);
  apply(draws);
  logits_ = std::move(fr.logits);
  stats_.sample_s += sampling.seconds();
  for (const Chunk& w : chunks) stats_.prompt_tokens += w.n;
  complete_finished_groups();
  return true;
}

void Engine::complete_finished_groups() {
  const ModelConfig& c = weights_->config();
  const size_t route_row = size_t(c.num_moe_layers() * c.num_experts_per_tok);
  const size_t indexer_row = size_t(model::num_csa_layers(c) * c.index_topk);
  for (auto it = active_.begin(); it != active_.end();) {
    Group& g = **it;
    bool done = int64_t(g.seqs.size()) == g.req.params.n || g.aborted;
    for (auto& q : g.seqs) done = done && q->finished;
    if (!done) {
      ++it;
      continue;
    }
    RequestResult res;
    res.id = g.id;
    res.prompt_ids = g.req.prompt_ids;
    if (g.req.prompt_logprob_start >= 0) {
      res.prompt_logprob_start = g.req.prompt_logprob_start;
      res.prompt_logprobs.assign(g.prompt_lp.begin() + res.prompt_logprob_start, g.prompt_lp.end());
      if (g.req.params.top_logprobs > 0)
        res.prompt_top_logprobs.assign(g.prompt_top.begin() + res.prompt_logprob_start, g.prompt_top.end());
    }
    // Samples never created (aborted before the fork) are reported as aborted.
    for (int64_t k = 0; k < g.req.params.n; ++k) {
      SampleResult sr;
      Sequence* q = k < int64_t(g.seqs.size()) ? g.seqs[size_t(k)].get() : nullptr;
      if (q) {
        sr.output_ids.assign(q->tokens.begin() + g.prompt_len, q->tokens.end());
        sr.logprobs = q->logprobs;
        sr.top_logprobs = q->top;
        if (!g.req.params.return_logprobs) {
          sr.logprobs.clear();
          sr.top_logprobs.clear();
        }
        sr.finish_reason = q->reason;
        sr.weight_version = q->version_first;
        sr.weight_version_end = q->version_last;
        sr.ttft_s = q->t_first;
        sr.latency_s = q->t_end;
        if (g.req.return_experts && route_row > 0)
          sr.routed_experts = rows_per_token(q->routes, q->tokens.size(), route_row);
        if (g.req.return_experts && indexer_row > 0)
          sr.indexer_topk = rows_per_token(q->indexer, q->tokens.size(), indexer_row);
      } else {
        sr.finish_reason = "abort";
      }
      res.samples.push_back(std::move(sr));
    }
    auto pit = promises_.find(g.id);
    if (pit != promises_.end()) {
      pit->second.set_value(std::move(res));
      promises_.erase(pit);
    } else {
      finished_[g.id] = std::move(res);
    }
    it = active_.erase(it);
    cv_.notify_all();
  }
}

std::vector<RequestResult> Engine::run_until_done(uint64_t id) {
  LS_CHECK(!background_) << "run_until_done while the background loop runs";
  std::vector<RequestResult> out;
  for (;;) {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (id != 0 && finished_.count(id)) break;
      if (id == 0 && waiting_.empty() && active_.empty()) break;
    }
    std::lock_guard<std::mutex> l(mu_);
    // Admission only happens inside step(); a request that can never be
    // admitted is rejected at submit(), so this loop makes progress.
    step();
  }
  std::lock_guard<std::mutex> l(mu_);
  if (id != 0) {
    out.push_back(std::move(finished_[id]));
    finished_.erase(id);
  } else {
    for (auto& [k, v] : finished_) out.push_back(std::move(v));
    finished_.clear();
  }
  return out;
}

std::vector<RequestResult> Engine::generate(std::vector<Request> requests) {
  std::vector<uint64_t> ids;
  for (auto& r : requests) ids.push_back(submit(std::move(r)));
  auto all = run_until_done(0);
  std::map<uint64_t, RequestResult> by_id;
  for (auto& r : all) by_id[r.id] = std::move(r);
  std::vector<RequestResult> out;
  for (uint64_t id : ids) out.push_back(std::move(by_id[id]));
  return out;
}

void Engine::start_background() {
  std::lock_guard<std::mutex> l(mu_);
  if (background_) return;
  background_ = true;
  stop_ = false;
  loop_ = std::thread([this] { loop(); });
}

// The background loop: one step under the lock, then the lock goes to the
// callers waiting for it (lock_between_steps) before the next step. An idle
// engine sleeps until a submission, a weight update or stop.
void Engine::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    if (waiting_.empty() && active_.empty() && pending_weights_ == nullptr) {
      cv_.wait(lock, [&] { return stop_ || !waiting_.empty() || !active_.empty() || pending_weights_; });
      continue;
    }
    try {
      step();
    } catch (const std::exception& e) {
      // A failing step must not take the server down silently: abort everything in flight.
      LS_LOG(Error) << "rollout engine step failed: " << e.what();
      for (auto& g : active_) {
        g->aborted = true;
        for (auto& q : g->seqs) finish_sample(*q, "abort");
      }
      complete_finished_groups();
    }
    if (lock_waiters_.load() == 0) continue;
    lock.unlock();
    // Each waiter holds the lock for a moment; a steady stream of them cannot
    // hold the engine up for more than a few milliseconds.
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(5);
    while (lock_waiters_.load() > 0 && std::chrono::steady_clock::now() < until) std::this_thread::yield();
    lock.lock();
  }
}

void Engine::stop_background() {
  {
    const auto l = lock_between_steps();
    if (!background_) return;
    stop_ = true;
  }
  cv_.notify_all();
  if (loop_.joinable()) loop_.join();
  std::lock_guard<std::mutex> l(mu_);
  background_ = false;
}

std::future<RequestResult> Engine::submit_async(Request request, TokenCallback on_token, uint64_t* id) {
  std::promise<RequestResult> p;
  auto fut = p.get_future();
  const uint64_t got = submit_impl(std::move(request), std::move(on_token), &p);
  if (id) *id = got;
  return fut;
}

}  // namespace lockstep::rollout
