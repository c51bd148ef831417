// DeepSeek-V4 at model level: finite-difference gradients of the whole model
// (mHC, compressed attention with both compressors, hash and scored MoE), and
// the alignment property: a token's logits are bit-identical whether its
// sequence is prefilled whole, in chunks that split compression blocks and
// windows, decoded token by token, batched with others, on 1 or 2 threads,
// or in blocks shared with another sequence; indexer and routing replay.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "common/test_util.h"
#include "common/v4_config.h"
#include "lockstep/model/forward.h"
#include "lockstep/model/params.h"
#include "lockstep/model/v4_forward.h"
#include "lockstep/model/weights.h"

namespace lockstep::model {
namespace {

using test::tiny_v4;

struct Fixture {
  explicit Fixture(const ModelConfig& c, uint64_t seed = 7) : layout(c), buf(alloc_params(layout)), ctx{nullptr, 0} {
    init_params(layout, buf.as<float>(), seed, 0.3f);
    // Non-trivial norms, biases, sinks and mixes so their gradients are exercised.
    auto noise = test::randn(layout.numel(), 99, 0.1f);
    for (const auto& p : layout.params())
      if (p.kind == ParamKind::Norm || p.kind == ParamKind::Bias)
        for (int64_t j = 0; j < p.numel; ++j) buf.as<float>()[p.offset + j] += noise[size_t(p.offset + j)];
    weights = std::make_unique<ModelWeights>(ctx, layout, buf.as<float>());
  }
  ParamLayout layout;
  Buffer buf;
  Context ctx;
  std::unique_ptr<ModelWeights> weights;
};

RaggedBatch full_batch(const std::vector<std::vector<int32_t>>& seqs, int max_blocks) {
  RaggedBatch b(max_blocks);
  std::vector<int32_t> blocks(static_cast<size_t>(max_blocks));
  for (size_t i = 0; i < seqs.size(); ++i) {
    std::iota(blocks.begin(), blocks.end(), int32_t(i) * max_blocks);
    b.add_sequence(seqs[i].data(), int32_t(seqs[i].size()), 0, blocks.data(), max_blocks);
  }
  b.logit_rows.resize(b.tokens.size());
  std::iota(b.logit_rows.begin(), b.logit_rows.end(), 0);
  return b;
}

std::vector<int32_t> random_tokens(int n, int vocab, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = int32_t(g() % uint32_t(vocab));
  return t;
}

struct RunOut {
  std::vector<float> logits;  // the main logits, then (with mtp) each MTP block's
  std::vector<int32_t> experts, indexer;
};

RunOut run(const Fixture& f, const RaggedBatch& b, int blocks, int block_size, bool mtp = false) {
  KvCache kv(f.layout.config(), blocks, block_size);
  Workspace ws;
  ForwardResult r;
  ForwardOptions o;
  o.record_experts = true;
  o.record_indexer = true;
  o.mtp = mtp;
  forward(f.ctx, *f.weights, kv, ws, b, o, &r);
  RunOut out{std::vector<float>(r.logits.f32(), r.logits.f32() + r.logits.numel()), r.routed_experts, r.indexer_topk};
  for (const OwnedTensor& m : r.mtp_logits) out.logits.insert(out.logits.end(), m.f32(), m.f32() + m.numel());
  return out;
}

// Central differences of a random projection of the logits on a spread of
// elements of every trained tensor; the indexer's tensors must get exactly 0.
// With `mtp`, the MTP blocks' logits join the probed output.
void gradient_check(Fixture& f, const std::vector<std::vector<int32_t>>& seqs, int trials, bool mtp = false) {
  const ModelConfig& c = f.layout.config();
  auto b = full_batch(seqs, 48);
  const int64_t R = int64_t(b.logit_rows.size()), n_mtp = mtp ? c.num_nextn_predict_layers : 0;
  auto probe = test::randn(R * c.vocab_size * (1 + n_mtp), 3);
  const int nblocks = 48 * int(seqs.size()), BS = 4;
  KvCache kv(c, nblocks, BS);
  Workspace ws;
  ForwardResult r;
  Activations acts;
  ForwardOptions opt;
  opt.save_activations = true;
  opt.record_experts = true;
  opt.record_indexer = true;
  opt.mtp = mtp;
  forward(f.ctx, *f.weights, kv, ws, b, opt, &r, &acts);
  Buffer gbuf = alloc_params(f.layout);
  ModelParams grads = bind(f.layout, gbuf.as<float>());
  std::vector<Tensor> dmtp;
  for (int64_t j = 0; j < n_mtp; ++j)
    dmtp.emplace_back(probe.data() + (j + 1) * R * c.vocab_size, DType::F32, std::initializer_list<int64_t>{R, c.vocab_size});
  backward(f.ctx, *f.weights, kv, ws, b, acts, Tensor(probe.data(), DType::F32, {R, c.vocab_size}), grads, dmtp);

  double gmax = 0;
  for (int64_t i = 0; i < f.layout.numel(); ++i) gmax = std::max(gmax, double(std::fabs(gbuf.as<float>()[i])));
  std::mt19937 g(5);
  int checked = 0, skipped = 0, trained = 0;
  for (const auto& p : f.layout.params()) {
    trained += !p.frozen;
    if (p.frozen) {
      for (int64_t j = 0; j < p.numel; ++j) ASSERT_EQ(gbuf.as<float>()[p.offset + j], 0.0f) << p.name;
      continue;
    }
    for (int trial = 0; trial < trials; ++trial) {
      const int64_t j = p.offset + int64_t(g() % uint64_t(p.numel));
      float* w = f.buf.as<float>() + j;
      const float orig = *w;
      const float eps = 2e-3f * std::max(1.0f, std::fabs(orig));
      auto eval = [&](float v) {
        *w = v;
        f.weights->refresh(f.ctx, 0);
        RunOut x = run(f, b, nblocks, BS, mtp);
        double s = 0;
        for (size_t i = 0; i < x.logits.size(); ++i) s += double(x.logits[i]) * probe[i];
        return std::make_pair(s, x);
      };
      auto [lp, rp] = eval(orig + eps);
      auto [lm, rm] = eval(orig - eps);
      *w = orig;
      f.weights->refresh(f.ctx, 0);
      // A flipped top-k (experts or compressed entries) is not differentiable there.
      if (rp.experts != r.routed_experts || rm.experts != r.routed_experts || rp.indexer != r.indexer_topk ||
          rm.indexer != r.indexer_topk) {
        ++skipped;
        continue;
      }
      const double fd = (lp - lm) / (2.0 * double(eps));
      const double an = gbuf.as<float>()[j];
      EXPECT_NEAR(an, fd, 1e-2 * std::fabs(fd) + 2e-3 * gmax) << p.name << " element " << j - p.offset;
      ++checked;
    }
  }
  EXPECT_GE(checked, trained * trials * 3 / 4);
  EXPECT_LE(skipped, checked / 4);
}

}  // namespace

// Short sequences: the window, CSA entries and the indexer, hash routing, mHC.
TEST(V4Grad, WholeModelShortSequences) {
  Fixture f(tiny_v4());
  gradient_check(f, {random_tokens(11, 48, 1), random_tokens(6, 48, 2)}, 3);
}

// 131 tokens: the HCA layer's first entry (positions 0..127) is in play. Both
// layers hash-routed and no CSA layer, so no top-k choice can flip.
TEST(V4Grad, WholeModelWithAnHcaEntry) {
  ModelConfig c = tiny_v4();
  c.num_layers = 2;
  c.compress_ratios = {0, 128};
  c.num_hash_layers = 2;
  Fixture f(c);
  gradient_check(f, {random_tokens(131, 48, 4)}, 2);
}

// One MTP block on top: its block, head, input projections and norms, and the
// gradient it sends into the main model's final streams and the embedding.
TEST(V4Grad, WholeModelWithTheMtpLoss) {
  ModelConfig c = tiny_v4();
  c.num_nextn_predict_layers = 1;
  c.compress_ratios.push_back(0);
  Fixture f(c);
  gradient_check(f, {random_tokens(11, 48, 1), random_tokens(6, 48, 2)}, 2, true);
}

TEST(V4Alignment, ChunkingDecodeBatchingThreadsAndBlockOrderGiveIdenticalBits) {
  ModelConfig c = tiny_v4();
  c.num_nextn_predict_layers = 1;  // not run here; its cache layer is left out with 2 threads below
  c.compress_ratios.push_back(0);
  Fixture f(c);
  const int L = 137, V = int(c.vocab_size), BS = 4, MB = 40;
  auto seq = random_tokens(L, V, 11);
  const RunOut ref = run(f, full_batch({seq}, MB), MB, BS);
  for (int chunk : {1, 3, 5, 64}) {
    for (int threads : {1, 2}) {
      ThreadPool pool(threads);
      Context ctx{&pool, 0};
      // With 2 threads, a cache without the MTP block's layer (the rollout engine's).
      KvCache kv(c, MB, BS, DType::F32, host_allocator(), /*with_mtp=*/threads == 1);
      Workspace ws;
      std::vector<int32_t> scrambled(static_cast<size_t>(MB));  // physical blocks in reverse order
      for (int j = 0; j < MB; ++j) scrambled[size_t(j)] = MB - 1 - j;
      for (int start = 0; start < L; start += chunk) {
        const int n = std::min(chunk, L - start);
        RaggedBatch b(MB);
        b.add_sequence(seq.data() + start, n, start, scrambled.data(), MB);
        for (int j = 0; j < n; ++j) b.logit_rows.push_back(j);
        ForwardResult r;
        ForwardOptions o;
        o.record_indexer = true;
        forward(ctx, *f.weights, kv, ws, b, o, &r);
        test::expect_bits_equal(r.logits.f32(), ref.logits.data() + int64_t(start) * V, int64_t(n) * V,
                                "chunked logits");
      }
    }
  }
  EXPECT_LT(KvCache(c, MB, BS, DType::F32, host_allocator(), false).nbytes(), KvCache(c, MB, BS).nbytes());
  // Inside a batch with two other sequences of different lengths.
  const RunOut rb = run(f, full_batch({random_tokens(9, V, 12), seq, random_tokens(30, V, 13)}, MB), 3 * MB, BS);
  test::expect_bits_equal(rb.logits.data() + 9 * V, ref.logits.data(), int64_t(L) * V, "batched logits");
}

// A snapshot of the V4 weights (mHC mixes, sinks, compressor positions and
// norms read unpacked; MTP blocks packed) gives the same logits, MTP's too,
// and keeps them when its source is written.
TEST(V4Forward, SnapshotWeightsGiveTheSameBitsAndKeepTheirVersion) {
  ModelConfig c = tiny_v4();
  c.num_nextn_predict_layers = 1;
  c.compress_ratios.push_back(0);
  Fixture f(c);
  const RaggedBatch b = full_batch({random_tokens(37, int(c.vocab_size), 3)}, 12);
  const RunOut want = run(f, b, 12, 4, /*mtp=*/true);
  f.weights = std::make_unique<ModelWeights>(f.ctx, f.layout, ModelWeights::SnapshotOf{f.buf.as<float>()});
  EXPECT_LT(f.weights->snapshot_bytes(), f.layout.nbytes() / 4);
  std::fill(f.buf.as<float>(), f.buf.as<float>() + f.layout.numel(), 0.5f);
  const RunOut got = run(f, b, 12, 4, /*mtp=*/true);
  ASSERT_EQ(got.logits.size(), want.logits.size());
  test::expect_bits_equal(got.logits.data(), want.logits.data(), int64_t(got.logits.size()),
                          "snapshot logits");
  EXPECT_EQ(got.experts, want.experts);
  EXPECT_EQ(got.indexer, want.indexer);
}

// Two sequences sharing a 12-token prefix in the same physical blocks, the
// second one's suffix decoded after the first has gone further: the shared
// blocks hold only entries of the prefix, so both match their own prefill.
TEST(V4Alignment, SharedPrefixBlocksServeBothSequences) {
  const ModelConfig c = tiny_v4();
  Fixture f(c);
  const int BS = 4, MB = 10, V = int(c.vocab_size);
  auto a = random_tokens(30, V, 21), b = a;
  for (size_t i = 12; i < b.size(); ++i) b[i] = int32_t((b[i] + 7) % V);
  const RunOut ra = run(f, full_batch({a}, MB), MB, BS), rb = run(f, full_batch({b}, MB), MB, BS);
  KvCache kv(c, 2 * MB, BS);
  Workspace ws;
  std::vector<int32_t> blocks_a(MB), blocks_b(MB);
  std::iota(blocks_a.begin(), blocks_a.end(), 0);
  blocks_b = blocks_a;
  for (int j = 3; j < MB; ++j) blocks_b[size_t(j)] = MB + j;  // first 3 blocks (12 positions) shared
  auto step = [&](const std::vector<int32_t>& toks, int start, int n, const std::vector<int32_t>& blocks) {
    RaggedBatch batch(MB);
    batch.add_sequence(toks.data() + start, n, start, blocks.data(), MB);
    for (int j = 0; j < n; ++j) batch.logit_rows.push_back(j);
    ForwardResult r;
    forward(f.ctx, *f.weights, kv, ws, batch, {}, &r);
    return std::vector<float>(r.logits.f32(), r.logits.f32() + r.logits.numel());
  };
  auto la = step(a, 0, 30, blocks_a);
  auto lb = step(b, 12, 18, blocks_b);  // reuses the prefix's cached blocks
  test::expect_bits_equal(la.data(), ra.logits.data(), 30 * int64_t(V), "sequence a");
  test::expect_bits_equal(lb.data(), rb.logits.data() + 12 * int64_t(V), 18 * int64_t(V), "sequence b suffix");
}

// Replaying the recorded routing and indexer choices reproduces the run; a
// replayed indexer choice the indexer would not make changes the logits.
TEST(V4Forward, IndexerAndRoutingReplay) {
  const ModelConfig c = tiny_v4();
  Fixture f(c);
  auto b = full_batch({random_tokens(40, int(c.vocab_size), 31)}, 12);
  const RunOut ref = run(f, b, 12, 4);
  ASSERT_EQ(ref.indexer.size(), size_t(40 * 2 * c.index_topk));
  KvCache kv(c, 12, 4);
  Workspace ws;
  ForwardResult r;
  ForwardOptions o;
  o.replay_experts = &ref.experts;
  o.replay_indexer = &ref.indexer;
  forward(f.ctx, *f.weights, kv, ws, b, o, &r);
  test::expect_bits_equal(r.logits.f32(), ref.logits.data(), int64_t(ref.logits.size()), "replayed logits");
  // Token 39 sees 10 CSA entries and keeps 3: replay a different 3.
  std::vector<int32_t> other = ref.indexer;
  int32_t* row = other.data() + (39 * 2 + 0) * c.index_topk;
  std::vector<int32_t> alt;
  for (int32_t e = 0; e < 10 && int64_t(alt.size()) < c.index_topk; ++e)
    if (std::find(row, row + c.index_topk, e) == row + c.index_topk) alt.push_back(e);
  std::copy(alt.begin(), alt.end(), row);
  KvCache kv2(c, 12, 4);
  ForwardResult r2;
  o.replay_indexer = &other;
  forward(f.ctx, *f.weights, kv2, ws, b, o, &r2);
  const int64_t V = c.vocab_size;
  test::expect_bits_equal(r2.logits.f32(), ref.logits.data(), 39 * V, "rows before the changed one");
  EXPECT_NE(0, std::memcmp(r2.logits.f32() + 39 * V, ref.logits.data() + 39 * V, size_t(V) * sizeof(float)));
  // Not ascending, or not visible: refused.
  std::vector<int32_t> bad = ref.indexer;
  bad[size_t((5 * 2 + 1) * c.index_topk)] = 9;  // token 5 sees one entry
  o.replay_indexer = &bad;
  KvCache kv3(c, 12, 4);
  EXPECT_THROW(forward(f.ctx, *f.weights, kv3, ws, b, o, &r2), Error);
}

}  // namespace lockstep::model
