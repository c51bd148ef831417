// The trainer and rollout sides of rollout over MPI, and its colocated
// data-parallel variant. Protocol on the weight_sync communicator (trainer
// root = rank 0): the root broadcasts a Command; then
//   kSync:     broadcast_weights from the root, then (aligned mode) the
//              checksum of the root's packed projections, which every
//              rollout rank compares with its own packing;
//   kGenerate: the root sends rank q its requests (tag kTagRequests) and
//              receives its results (tag kTagResults), in rank order;
//   kStop:     the rollout ranks leave serve_rollout.
// The root may train between sending the requests (submit) and receiving the
// results (collect); a rollout rank then waits in its send. It never reads a
// command before its results are received, which is why the root must collect
// before it sends another command.
#include "lockstep/rl/mpi_rollout.h"

#include <cstdio>
#include <string>

#include "lockstep/base/error.h"
#include "lockstep/base/rng.h"
#include "lockstep/base/timer.h"
#include "lockstep/comm/messages.h"
#include "lockstep/kernels/gpu/backend.h"
#include "lockstep/model/packed_checksum.h"
#include "lockstep/parallel/data_parallel.h"
#include "lockstep/rl/rollout_wire.h"

namespace lockstep::rl {

namespace {

enum CommandKind : int64_t { kSync = 1, kGenerate = 2, kStop = 3 };
struct Command {
  int64_t kind = 0;
};
constexpr int kTagRequests = 7101, kTagResults = 7102;

// After a sync, in aligned mode: the checksum of the trainer root's packed
// projections (model::packed_checksum over its experts), which every rollout
// rank compares with its own packing of the broadcast master.
struct PackedSum {
  int64_t check = 0;  // 1: aligned, compare; 0: fast mode (the packings differ by design)
  uint64_t sum = 0;
  int64_t first_expert = 0, expert_count = -1;
};

// Collective over sync: every rank learns which rollout ranks' packed bits
// differ from the root's, and all throw together if any do.
void agree_on_packed_bits(comm::Communicator& sync, int64_t differs, const std::string& detail) {
  const std::vector<int64_t> all = sync.all_gather(differs);
  std::string ranks;
  for (size_t q = 0; q < all.size(); ++q)
    if (all[q]) ranks += (ranks.empty() ? "" : ", ") + std::to_string(q);
  if (ranks.empty()) return;
  LS_THROW << "weight sync: the packed weights of rollout rank(s) " << ranks
           << " differ from the trainer's after packing the same f32 master "
           << (detail.empty() ? std::string("(see those ranks' messages)") : detail)
           << "; aligned mode cannot hold (is every rank running the same lockstep build?)";
}


// Appends b to a, moving.
void append(std::vector<rollout::RequestResult>& a, std::vector<rollout::RequestResult>&& b) {
  for (auto& r : b) a.push_back(std::move(r));
}

}  // namespace

void fill_missing_seeds(std::vector<rollout::Request>& requests, uint64_t seed, uint64_t call) {
  for (size_t i = 0; i < requests.size(); ++i)
    if (requests[i].params.seed < 0)  // non-negative: a negative seed means "engine's choice"
      requests[i].params.seed = int64_t(mix_seed(mix_seed(seed, call), i) >> 1);
}

// ---------------------------------------------------------------- MpiRollout

MpiRollout::MpiRollout(train::Trainer& trainer, comm::Communicator* sync, comm::Communicator* trainers,
                       const rollout::RolloutSection& cfg, uint64_t seed)
    : sync_(sync), trainers_(trainers), aligned_(cfg.aligned()), seed_(seed) {
  if (sync_) {
    LS_CHECK(sync_->valid() && sync_->rank() == 0) << "MpiRollout: the trainer root must be rank 0 of '"
                                                   << sync_->name() << "'";
    LS_CHECK(sync_->size() >= 2) << "MpiRollout: no rollout ranks in '" << sync_->name() << "'";
  }
  if (trainers_ && trainers_->valid() && trainers_->size() > 1) {
    LS_CHECK((trainers_->rank() == 0) == is_root()) << "MpiRollout: trainer rank 0 must be the one holding the "
                                                    << "weight_sync communicator";
  }
  MpiRollout::sync(trainer);
}

std::vector<rollout::RequestResult> MpiRollout::generate(std::vector<rollout::Request> requests,
                                                         const RolloutProgress& progress, int64_t* generated_tokens) {
  submit(std::move(requests));
  return collect(progress, generated_tokens);
}

void MpiRollout::submit(std::vector<rollout::Request> requests) {
  LS_CHECK(!stopped_) << "MpiRollout::submit after shutdown";
  LS_CHECK(!in_flight_) << "MpiRollout: a second batch submitted before the first was collected";
  const size_t n = requests.size();
  fill_missing_seeds(requests, seed_, calls_++);
  in_flight_ = true;
  in_flight_n_ = n;
  if (!is_root()) return;  // the other trainer ranks receive the results from the root in collect()
  const int R = sync_->size() - 1;
  Command c{kGenerate};
  sync_->broadcast_value(c, 0);
  // Rollout rank q gets share q - 1: contiguous, whole requests (groups).
  in_flight_shares_ = parallel::split_even(n, R);
  for (int q = 1; q <= R; ++q) {
    const parallel::Range s = in_flight_shares_[size_t(q - 1)];
    const std::vector<rollout::Request> part(std::make_move_iterator(requests.begin() + ptrdiff_t(s.begin)),
                                             std::make_move_iterator(requests.begin() + ptrdiff_t(s.end)));
    comm::send_message(*sync_, encode_requests(part), q, kTagRequests);
  }
}

std::vector<rollout::RequestResult> MpiRollout::collect(const RolloutProgress& progress, int64_t* generated_tokens) {
  LS_CHECK(in_flight_) << "MpiRollout::collect without a submitted batch";
  in_flight_ = false;
  const size_t n = in_flight_n_;
  std::vector<rollout::RequestResult> results;
  int64_t tokens = 0;
  const bool share = trainers_ && trainers_->valid() && trainers_->size() > 1;
  if (is_root()) {
    const int R = sync_->size() - 1;
    for (int q = 1; q <= R; ++q) {
      int64_t t = 0;
      auto part = decode_results(comm::recv_message(*sync_, q, kTagResults), &t);
      const parallel::Range s = in_flight_shares_[size_t(q - 1)];
      if (part.size() != s.size())
        LS_THROW << "rollout rank " << q << " returned " << part.size() << " results for " << s.size() << " requests";
      append(results, std::move(part));
      tokens += t;
    }
    if (share) {
      std::vector<char> all = encode_results(results, tokens);
      comm::broadcast_message(*trainers_, all, 0);
    }
  } else {
    LS_CHECK(share) << "MpiRollout on a trainer rank without the weight_sync communicator needs the trainer group";
    std::vector<char> all;
    comm::broadcast_message(*trainers_, all, 0);
    results = decode_results(all, &tokens);
    if (results.size() != n)
      LS_THROW << "the trainer root sent " << results.size() << " rollout results for " << n << " requests "
               << "(the trainer ranks disagree on the batch)";
  }
  int64_t samples = 0;
  for (const auto& r : results) samples += int64_t(r.samples.size());
  if (progress) progress(samples, tokens);
  if (generated_tokens) *generated_tokens = tokens;
  return results;
}

void MpiRollout::sync(train::Trainer& trainer) {
  LS_CHECK(!in_flight_) << "MpiRollout::sync while a batch is in flight (collect it first: the rollout ranks "
                        << "take no weights before they have sent their results)";
  // The trainer root publishes; the others hold the same weights, except
  // with expert parallelism, where the root's group streams the model to it
  // layer by layer (a collective over the group) while it broadcasts.
  if (!is_root()) return trainer.stream_model(false, {});
  LS_CHECK(!stopped_) << "MpiRollout::sync after shutdown";
  Command c{kSync};
  sync_->broadcast_value(c, 0);
  if (train::LoraState* lora = trainer.lora()) {  // the base never changes: only the adapters travel
    parallel::WeightBroadcaster out(*sync_, size_t(lora->numel()), trainer.version(), 0);
    const std::vector<float> adapters = lora->host_params();  // a copy: they may lie in device memory
    out.push(adapters.data(), adapters.size());
    last_sync_ = out.finish();
  } else {
    parallel::WeightBroadcaster out(*sync_, size_t(trainer.model_layout().numel()), trainer.version(), 0);
    trainer.stream_model(true, [&](const float* d, int64_t n) { out.push(d, size_t(n)); });
    last_sync_ = out.finish();
  }
  const model::ExpertShard shard = trainer.weights().experts();
  PackedSum ps{aligned_ ? 1 : 0, aligned_ ? model::packed_checksum(trainer.weights(), shard) : 0, shard.first,
               shard.count};
  sync_->broadcast_value(ps, 0);
  if (ps.check) agree_on_packed_bits(*sync_, 0, "");
}

void MpiRollout::shutdown() {
  if (!is_root() || stopped_) return;
  LS_CHECK(!in_flight_) << "MpiRollout::shutdown while a batch is in flight (collect it first)";
  Command c{kStop};
  sync_->broadcast_value(c, 0);
  stopped_ = true;
}

// ---------------------------------------------------------------- SpreadRollout

SpreadRollout::SpreadRollout(train::Trainer& trainer, comm::Communicator& trainers,
                             const rollout::RolloutSection& cfg, uint64_t seed)
    : local_(trainer, cfg, seed), trainers_(trainers), seed_(seed) {
  LS_CHECK(trainers_.valid()) << "SpreadRollout on a rank outside the trainer group";
}

std::vector<rollout::RequestResult> SpreadRollout::generate(std::vector<rollout::Request> requests,
                                                            const RolloutProgress& progress,
                                                            int64_t* generated_tokens) {
  const size_t n = requests.size();
  fill_missing_seeds(requests, seed_, calls_++);
  const int P = trainers_.size(), me = trainers_.rank();
  const std::vector<parallel::Range> shares = parallel::split_even(n, P);
  const parallel::Range s = shares[size_t(me)];
  std::vector<rollout::Request> mine(std::make_move_iterator(requests.begin() + ptrdiff_t(s.begin)),
                                     std::make_move_iterator(requests.begin() + ptrdiff_t(s.end)));
  int64_t my_tokens = 0;
  std::vector<char> my_bytes = encode_results(local_.generate(std::move(mine), progress, &my_tokens), my_tokens);
  // Every rank's share to every rank, in rank order: the results come out in request order.
  std::vector<rollout::RequestResult> results;
  int64_t tokens = 0;
  for (int q = 0; q < P; ++q) {
    std::vector<char> bytes;
    if (q == me) bytes = my_bytes;
    comm::broadcast_message(trainers_, bytes, q);
    int64_t t = 0;
    auto part = decode_results(bytes, &t);
    if (part.size() != shares[size_t(q)].size())
      LS_THROW << "trainer rank " << q << " generated " << part.size() << " results for "
               << shares[size_t(q)].size() << " requests";
    append(results, std::move(part));
    tokens += t;
  }
  if (generated_tokens) *generated_tokens = tokens;
  return results;
}

// ---------------------------------------------------------------- rollout rank

namespace {

// The rollout rank's side of the packed-bits check after a sync.
void check_packed_bits(comm::Communicator& sync, const model::ModelWeights& weights) {
  PackedSum ps;
  sync.broadcast_value(ps, 0);
  if (!ps.check) return;
  const uint64_t mine = model::packed_checksum(weights, {ps.first_expert, ps.expert_count});
  std::string detail;
  if (mine != ps.sum) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "(packed checksum %016llx here, %016llx on the trainer root)",
                  (unsigned long long)mine, (unsigned long long)ps.sum);
    detail = buf;
  }
  agree_on_packed_bits(sync, mine != ps.sum ? 1 : 0, detail);
}

}  // namespace

ServeStats serve_rollout(comm::Communicator& sync, const Context& ctx, const ModelConfig& config,
                         float* params, const rollout::RolloutSection& cfg, uint64_t seed,
                         const model::LoraConfig& lora) {
  LS_CHECK(sync.valid() && sync.rank() != 0) << "serve_rollout runs on rollout ranks (rank >= 1 of weight_sync)";
  const ParamLayout layout(config);  // outlives weights, which point into it
  const DType storage = rollout::precision_dtype(cfg.precision);
  model::ModelWeights weights(ctx, layout, params, storage, storage == DType::FP8E4M3 ? cfg.fp8_block : 0);
  // LoRA: the base stays as loaded (the trainer's is frozen); every sync
  // overwrites the adapters, received on the host and copied into the
  // memory the engine's kernels read (device memory on a GPU backend).
  std::unique_ptr<LoraLayout> lora_layout;
  std::vector<float> lora_params;
  Buffer lora_engine;
  std::unique_ptr<model::LoraWeights> adapters;
  const Allocator& memory = kernels::device_memory(ctx);
  if (lora.enabled()) {
    lora_layout = std::make_unique<LoraLayout>(layout, lora.spec());
    lora_params.assign(size_t(lora_layout->numel()), 0.0f);
    init_lora(*lora_layout, lora_params.data(), lora.init_seed);  // the trainer's start, until the first sync
    lora_engine = Buffer(lora_params.size() * sizeof(float), memory, Fill::Undefined, "lora adapters");
    memory.copy_in(lora_engine.data(), lora_params.data(), lora_engine.size());
    adapters = std::make_unique<model::LoraWeights>(*lora_layout, lora_engine.as<float>());
    weights.set_lora(adapters.get());
  }
  rollout::EngineConfig ec = cfg.engine;
  ec.seed = seed;
  rollout::Engine engine(ctx, &weights, ec);
  ServeStats st;
  for (;;) {
    Command c;
    sync.broadcast_value(c, 0);
    if (c.kind == kStop) return st;
    Timer t;
    if (c.kind == kSync) {
      float* into = adapters ? lora_params.data() : params;
      const size_t n = adapters ? lora_params.size() : size_t(layout.numel());
      const parallel::WeightSyncStats ws = parallel::broadcast_weights(sync, into, n, 0, 0);
      if (adapters) {
        memory.copy_in(lora_engine.data(), lora_params.data(), lora_engine.size());
        weights.set_version(ws.version);  // the engine reads the adapters in place
      } else
        weights.refresh(ctx, ws.version);  // repack the projections from the new f32 buffer
      check_packed_bits(sync, weights);
      engine.update_weights(&weights);   // drops KV state built on the old weights
      st.version = ws.version;
      ++st.syncs;
      st.sync_seconds += t.seconds();
    } else if (c.kind == kGenerate) {
      std::vector<rollout::Request> reqs = decode_requests(comm::recv_message(sync, 0, kTagRequests));
      const int64_t before = engine.stats().generated_tokens;
      st.requests += int64_t(reqs.size());
      const std::vector<rollout::RequestResult> results = engine.generate(std::move(reqs));
      const int64_t tokens = engine.stats().generated_tokens - before;
      st.generated_tokens += tokens;
      comm::send_message(sync, encode_results(results, tokens), 0, kTagResults);
      ++st.generate_calls;
      st.generate_seconds += t.seconds();
    } else {
      LS_THROW << "rollout rank " << sync.rank() << ": unknown command " << c.kind
               << " from the trainer root (every rank must run the same lockstep build)";
    }
  }
}

}  // namespace lockstep::rl
