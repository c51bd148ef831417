// Tests of the paths the performance work added to forward/backward: buffers
// reused from call to call (the workspace's slots, saved activations,
// logits), whole experts run on separate threads, and the trainer's buffers
// shared by its micro-batches. Each must leave every output bit unchanged:
// logits and gradients equal those of fresh buffers and of one thread.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <random>

#include "common/test_util.h"
#include "lockstep/model/forward.h"
#include "lockstep/model/params.h"
#include "lockstep/train/trainer.h"

namespace lockstep::model {
namespace {

// kind 0: Qwen3-MoE; 1: dots1-style (sigmoid router, shared expert, first
// layer dense); 2: Qwen2-MoE (qkv bias, gated shared expert); 3: dense Llama.
ModelConfig config(int kind) {
  ModelConfig c;
  c.vocab_size = 96;
  c.hidden_size = 32;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.max_position_embeddings = 256;
  if (kind == 3) {
    c.architecture = Architecture::Llama;
    c.intermediate_size = 40;
    return c;
  }
  c.num_experts = 8;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 16;
  if (kind == 0) {
    c.architecture = Architecture::Qwen3Moe;
    c.qk_norm = true;
    c.norm_topk_prob = true;
  } else if (kind == 1) {
    c.architecture = Architecture::Dots1;
    c.qk_norm = true;
    c.norm_topk_prob = true;
    c.router_scoring = RouterScoring::Sigmoid;
    c.score_correction_bias = true;
    c.routed_scaling_factor = 2.5;
    c.n_shared_experts = 1;
    c.shared_expert_intermediate_size = 16;
    c.first_k_dense_replace = 1;
    c.intermediate_size = 40;
  } else {
    c.architecture = Architecture::Qwen2Moe;
    c.qkv_bias = true;
    c.n_shared_experts = 1;
    c.shared_expert_intermediate_size = 24;
    c.shared_expert_gate = true;
  }
  return c;
}

std::vector<int32_t> tokens(int n, int vocab, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = int32_t(g() % uint32_t(vocab));
  return t;
}

RaggedBatch batch_of(const std::vector<std::vector<int32_t>>& seqs, int max_blocks) {
  RaggedBatch b(max_blocks);
  std::vector<int32_t> blocks(static_cast<size_t>(max_blocks));
  for (size_t i = 0; i < seqs.size(); ++i) {
    std::iota(blocks.begin(), blocks.end(), int32_t(i) * max_blocks);
    const int32_t row = b.add_sequence(seqs[i].data(), int32_t(seqs[i].size()), 0, blocks.data(), max_blocks);
    // Every row but the sequence's last (as the trainer asks).
    for (size_t j = 0; j + 1 < seqs[i].size(); ++j) b.logit_rows.push_back(row + int32_t(j));
  }
  return b;
}

struct Model {
  explicit Model(const ModelConfig& c) : layout(c), buf(alloc_params(layout)) {
    init_params(layout, buf.as<float>(), 3, 0.3f);
    auto noise = test::randn(layout.numel(), 8, 0.05f);
    for (const auto& p : layout.params())
      if (p.kind != ParamKind::Matrix)
        for (int64_t j = 0; j < p.numel; ++j) buf.as<float>()[p.offset + j] += noise[size_t(p.offset + j)];
    weights = std::make_unique<ModelWeights>(Context{}, layout, buf.as<float>());
  }
  ParamLayout layout;
  Buffer buf;
  std::unique_ptr<ModelWeights> weights;
};

// Logits and accumulated gradients of one forward + backward.
struct Outputs {
  std::vector<float> logits, grads;
};

Outputs run(const Context& ctx, const Model& m, KvCache& kv, Workspace& ws, Activations& acts, ForwardResult& fr,
            const RaggedBatch& b) {
  ForwardOptions o;
  o.save_activations = true;
  forward(ctx, *m.weights, kv, ws, b, o, &fr, &acts);
  const int64_t n = fr.logits.numel();
  Outputs out;
  out.logits.assign(fr.logits.f32(), fr.logits.f32() + n);
  auto dlogits = test::randn(n, 21);
  Buffer g = alloc_params(m.layout);
  backward(ctx, *m.weights, kv, ws, b, acts, Tensor(dlogits.data(), DType::F32, {fr.logits.view().dim(0), fr.logits.view().dim(1)}),
           bind(m.layout, g.as<float>()));
  out.grads.assign(g.as<float>(), g.as<float>() + m.layout.numel());
  return out;
}

void expect_same(const Outputs& a, const Outputs& b, const std::string& what) {
  ASSERT_EQ(a.logits.size(), b.logits.size()) << what;
  ASSERT_EQ(a.grads.size(), b.grads.size()) << what;
  test::expect_bits_equal(a.logits.data(), b.logits.data(), int64_t(a.logits.size()), (what + " logits").c_str());
  test::expect_bits_equal(a.grads.data(), b.grads.data(), int64_t(a.grads.size()), (what + " grads").c_str());
}

}  // namespace

// One thread, fresh buffers: the reference. Then 2 threads (whole experts per
// thread once enough experts have rows), and buffers reused after a larger
// and a smaller batch (stale workspace slots and saved tensors of other shapes).
TEST(ModelReuse, ThreadsAndReusedBuffersGiveIdenticalLogitsAndGradients) {
  for (int kind = 0; kind < 4; ++kind) {
    const ModelConfig c = config(kind);
    Model m(c);
    const int V = int(c.vocab_size);
    const auto b = batch_of({tokens(37, V, 1), tokens(20, V, 2), tokens(51, V, 3)}, 16);
    const auto big = batch_of({tokens(60, V, 4), tokens(60, V, 5), tokens(55, V, 6)}, 16);
    const auto small = batch_of({tokens(9, V, 7)}, 16);

    KvCache kv0(c, 64, 4);
    Workspace ws0;
    Activations a0;
    ForwardResult r0;
    const Outputs ref = run(Context{}, m, kv0, ws0, a0, r0, b);

    ThreadPool pool(2);
    const Context ctx2{&pool, 0};
    KvCache kv1(c, 64, 4);
    Workspace ws1;
    Activations a1;
    ForwardResult r1;
    expect_same(ref, run(ctx2, m, kv1, ws1, a1, r1, b), "kind " + std::to_string(kind) + " 2 threads");

    // The same cache, workspace, activations and result object after other batches.
    run(ctx2, m, kv1, ws1, a1, r1, big);
    run(ctx2, m, kv1, ws1, a1, r1, small);
    expect_same(ref, run(ctx2, m, kv1, ws1, a1, r1, b), "kind " + std::to_string(kind) + " reused, 2 threads");
    run(Context{}, m, kv0, ws0, a0, r0, big);
    expect_same(ref, run(Context{}, m, kv0, ws0, a0, r0, b), "kind " + std::to_string(kind) + " reused, 1 thread");
  }
}

// The trainer shares its buffers between micro-batches: gradients of one call
// over several micro-batches equal those of one call per micro-batch (each
// with fresh buffers), even when the loss leaves some dlogp unwritten.
TEST(ModelReuse, TrainerMicroBatchesSharingBuffersMatchSeparateCalls) {
  for (int kind : {0, 2}) {
    const ModelConfig c = config(kind);
    ParamLayout layout(c);
    std::vector<train::TrainSequence> seqs;
    for (int i = 0; i < 6; ++i) {
      train::TrainSequence s;
      s.tokens = tokens(10 + 7 * i, int(c.vocab_size), uint32_t(30 + i));
      s.prompt_len = 1 + i % 3;
      seqs.push_back(s);
    }
    train::LossFn loss = [](size_t seq, const float* logp, const float*, int64_t n, float* dlogp, float*) {
      double l = 0;
      for (int64_t i = 0; i < n; ++i) {
        l -= logp[i];
        if ((i + int64_t(seq)) % 3 != 0) dlogp[i] = -0.1f;  // the rest stay 0
      }
      return l;
    };
    for (int threads : {1, 2}) {
      ThreadPool pool(threads);
      const Context ctx{&pool, 0};
      train::TrainerConfig tc;
      tc.micro_batch_tokens = 40;  // several micro-batches of different sizes
      auto make = [&] {
        Buffer p = alloc_params(layout);
        init_params(layout, p.as<float>(), 5, 0.3f);
        return train::Trainer(ctx, c, std::move(p), tc);
      };
      train::Trainer together = make(), apart = make();
      ASSERT_GT(together.micro_batches(seqs).size(), size_t(2));
      together.accumulate(seqs, loss, {});
      for (auto [b0, b1] : apart.micro_batches(seqs)) {
        std::vector<train::TrainSequence> part(seqs.begin() + int64_t(b0), seqs.begin() + int64_t(b1));
        apart.accumulate(part, [&](size_t i, const float* lp, const float* e, int64_t n, float* d, float* de) {
          return loss(i + b0, lp, e, n, d, de);
        }, {});
      }
      test::expect_bits_equal(together.grads(), apart.grads(), layout.numel(), "gradients");
    }
  }
}

}  // namespace lockstep::model
