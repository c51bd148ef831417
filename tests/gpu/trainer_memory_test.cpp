// The trainer's host code on strict device memory (interpret mode, where a
// host read of device memory dies as on a device): the allocator's fill, the
// optimizer's norm, clipping and state files, checkpoint writes and whole SFT
// steps keep the bits they have in host memory.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <vector>

#include "lockstep/kernels/cpu/adamw.h"
#include "lockstep/kernels/gpu/backend.h"
#include "lockstep/kernels/gpu/portable.h"
#include "lockstep/model/params.h"
#include "lockstep/model/safetensors.h"
#include "lockstep/train/checkpoint.h"
#include "lockstep/train/critic.h"
#include "lockstep/train/host_copies.h"
#include "lockstep/train/optimizer.h"
#include "lockstep/train/sft.h"

namespace fs = std::filesystem;

namespace lockstep::train {
namespace {

namespace emu = ::lockstep::gpu::emu;

const Allocator& device() {
  return *kernels::interpret_backend().memory;
}

// Strict mode whatever the environment says: these tests are about it.
emu::Options strict_options() {
  emu::Options o = emu::options();
  o.host_access = false;
  return o;
}

Context device_context() {
  Context c;
  c.gpu = &kernels::interpret_backend();
  return c;
}

std::vector<float> random_floats(size_t n, uint32_t seed, float scale) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

Buffer on_device(const std::vector<float>& host, const char* what) {
  Buffer b(host.size() * sizeof(float), device(), Fill::Undefined, what);
  device().copy_in(b.data(), host.data(), host.size() * sizeof(float));
  return b;
}

std::vector<float> to_host(const Buffer& b, size_t n) {
  std::vector<float> out(n);
  device().copy_out(out.data(), b.data(), n * sizeof(float));
  return out;
}

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string temp_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("lockstep_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

// The interpret allocator without its own fill: Allocator::fill's default.
class NoFillAllocator final : public Allocator {
 public:
  const char* name() const override { return "no-fill"; }
  void* allocate(size_t b, Fill f, const char* w) const override { return device().allocate(b, f, w); }
  void release(void* p) const noexcept override { device().release(p); }
  bool host_visible() const override { return device().host_visible(); }
  void copy_in(void* d, const void* s, size_t b) const override { device().copy_in(d, s, b); }
  void copy_out(void* d, const void* s, size_t b) const override { device().copy_out(d, s, b); }
  bool holds(const void* p) const override { return device().holds(p); }
  void copy(void* d, const void* s, size_t b) const override { device().copy(d, s, b); }
};

TEST(GpuTrainerMemory, FillSetsExactlyTheRangeOnEveryAllocator) {
  const emu::ScopedOptions strict(strict_options());
  const NoFillAllocator no_fill;
  // 2.5 MiB: the default's 1 MiB host block goes round three times.
  const size_t bytes = (size_t{5} << 19) + 64;
  const size_t lo = 3, n = bytes - 67;  // an unaligned range, both ends inside
  for (const Allocator* a : {&device(), static_cast<const Allocator*>(&no_fill), &host_allocator()}) {
    SCOPED_TRACE(a->name());
    Buffer b(bytes, *a, Fill::Zero, "fill target");
    a->fill(static_cast<char*>(b.data()) + lo, 0xA5, n);
    std::vector<unsigned char> got(bytes);
    a->copy_out(got.data(), b.data(), bytes);
    for (size_t i = 0; i < bytes; ++i) {
      const unsigned char want = i >= lo && i < lo + n ? 0xA5 : 0;
      ASSERT_EQ(got[i], want) << "byte " << i;
    }
  }
}

TEST(GpuTrainerMemory, GradNormAndClippingOnDeviceMemoryKeepTheHostBits) {
  const emu::ScopedOptions strict(strict_options());
  const Context ctx = device_context(), cpu;
  // More than two of the host copy's chunks, the last one ragged.
  const int64_t n = 2 * kernels::kNormChunk * 1024 + 777;
  std::vector<float> g = random_floats(size_t(n), 11, 0.3f);
  g[5] = 1e-30f;  // tiny and huge values: double squares keep them
  g[size_t(n) - 1] = 3e4f;
  Buffer dg = on_device(g, "gradients");
  const double want = kernels::global_grad_norm(cpu, g.data(), n);
  const double got = grad_norm(ctx, device(), dg.as<float>(), n);
  EXPECT_EQ(std::memcmp(&want, &got, sizeof want), 0) << want << " vs " << got;
  const float factor = float(1.0 / want);
  kernels::scale_grads(cpu, {kernels::FloatSegment{g.data(), n}}, factor);
  scale_gradients(ctx, device(), dg.as<float>(), n, factor);
  const std::vector<float> back = to_host(dg, size_t(n));
  EXPECT_EQ(std::memcmp(back.data(), g.data(), g.size() * 4), 0);
  EXPECT_NE(back[5], 1e-30f);  // scaled, not left alone
}

TEST(GpuTrainerMemory, SegmentNormSumsAndReductionsThroughHostChunksKeepTheHostBits) {
  const emu::ScopedOptions strict(strict_options());
  const Context ctx = device_context(), cpu;
  // Segments as the world-invariant norm gives them (one per tensor): one
  // longer than a host copy, one shorter than a norm chunk, one ragged.
  const int64_t chunk = kernels::kNormChunk * 1024;
  const int64_t sizes[3] = {chunk + kernels::kNormChunk / 2 + 3, 5, 3 * kernels::kNormChunk + 1};
  const int64_t n = sizes[0] + sizes[1] + sizes[2];
  std::vector<float> g = random_floats(size_t(n), 17, 0.2f);
  Buffer dg = on_device(g, "gradients");
  std::vector<kernels::FloatSegment> on_host, on_dev;
  for (int64_t at = 0, i = 0; i < 3; at += sizes[i], ++i) {
    on_host.push_back({g.data() + at, sizes[i]});
    on_dev.push_back({dg.as<float>() + at, sizes[i]});
  }
  const std::vector<double> want = kernels::norm_chunk_sums(cpu, on_host);
  const std::vector<double> got = norm_chunk_sums(ctx, device(), on_dev);
  ASSERT_EQ(want.size(), got.size());
  EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(double)), 0);
  // A reduction sees host chunks, consecutive and in order, and its result
  // lands back in device memory.
  std::vector<size_t> seen;
  reduce_through_host(device(), dg.as<float>(), n, [&](float* h, size_t m) {
    seen.push_back(m);
    for (size_t i = 0; i < m; ++i) h[i] = h[i] * 2.0f;
  });
  ASSERT_EQ(seen.size(), size_t((n + chunk - 1) / chunk));
  EXPECT_EQ(seen[0], size_t(chunk));
  const std::vector<float> back = to_host(dg, size_t(n));
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(back[size_t(i)], g[size_t(i)] * 2.0f) << "element " << i;
}

ModelConfig tiny_moe() {
  ModelConfig c;
  c.architecture = Architecture::Qwen3Moe;
  c.vocab_size = 32;
  c.hidden_size = 32;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.qk_norm = true;
  c.num_experts = 4;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 32;
  c.norm_topk_prob = true;
  c.max_position_embeddings = 128;
  return c;
}

TEST(GpuTrainerMemory, AdamWOnDeviceMemoryMatchesTheHostAndSavesTheSameBytes) {
  const emu::ScopedOptions strict(strict_options());
  const ParamLayout layout(tiny_moe());
  const size_t n = size_t(layout.numel());
  OptimizerConfig oc;
  oc.lr = 1e-2;
  oc.weight_decay = 0.1;
  oc.grad_clip = 0.5;  // below the gradients' norm: every step clips
  AdamW host(layout, oc), dev(layout, oc, nullptr, device());
  std::vector<float> p = random_floats(n, 3, 0.1f);
  Buffer dp = on_device(p, "parameters");
  for (int step = 0; step < 3; ++step) {
    std::vector<float> g = random_floats(n, 100 + step, 0.05f);
    Buffer dg = on_device(g, "gradients");
    const OptimizerStats hs = host.step(Context{}, p.data(), g.data(), {});
    const OptimizerStats ds = dev.step(device_context(), dp.as<float>(), dg.as<float>(), {});
    ASSERT_GT(hs.grad_norm, oc.grad_clip);
    EXPECT_EQ(std::memcmp(&hs.grad_norm, &ds.grad_norm, sizeof(double)), 0) << "step " << step;
    ASSERT_EQ(std::memcmp(to_host(dp, n).data(), p.data(), n * 4), 0)
        << "parameters differ after step " << step;
  }
  const std::string dir = temp_dir("gpu_adamw_state");
  host.save(dir + "/host.bin");
  dev.save(dir + "/device.bin");
  const std::string want = file_bytes(dir + "/host.bin");
  EXPECT_EQ(want.size(), 24 + 8 * n);
  EXPECT_TRUE(want == file_bytes(dir + "/device.bin")) << "optimizer.bin from device memory differs";
  // Loaded into device memory and saved again: the same file.
  AdamW again(layout, oc, nullptr, device());
  again.load(dir + "/device.bin");
  again.save(dir + "/again.bin");
  EXPECT_TRUE(want == file_bytes(dir + "/again.bin"));
  fs::remove_all(dir);
}

TEST(GpuTrainerMemory, SafetensorsFromDeviceMemoryHaveTheHostsBytes) {
  const emu::ScopedOptions strict(strict_options());
  // Over the writer's 1 Mi-float chunk, so several host copies per tensor.
  const std::vector<float> a = random_floats((size_t{3} << 19) + 5, 7, 1.0f), b = random_floats(33, 8, 1.0f);
  Buffer da = on_device(a, "big tensor"), db = on_device(b, "small tensor");
  const std::vector<int64_t> sa{int64_t(a.size())}, sb{3, 11};
  const std::string dir = temp_dir("gpu_safetensors");
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    // "c": raw bytes (an integer table such as DeepSeek-V4's tid2eid), b's.
    SafetensorsTensor host_c{"c", sb, nullptr}, device_c{"c", sb, nullptr};
    host_c.raw = b.data();
    device_c.raw = db.data();
    host_c.raw_dtype = device_c.raw_dtype = "I32";
    write_safetensors(dir + "/host.safetensors", {{"a", sa, a.data()}, {"b", sb, b.data()}, host_c}, dt);
    write_safetensors(dir + "/device.safetensors",
                      {{"a", sa, da.as<float>()}, {"b", sb, db.as<float>()}, device_c}, dt);
    const std::string want = file_bytes(dir + "/host.safetensors");
    EXPECT_GT(want.size(), a.size() * dtype_size(dt));
    EXPECT_TRUE(want == file_bytes(dir + "/device.safetensors")) << "checksums or data differ";
  }
  fs::remove_all(dir);
}

// "a b c d =" -> the digits reversed, as the SFT tests' toy task.
std::vector<TrainSequence> dataset(int n, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<TrainSequence> out;
  for (int i = 0; i < n; ++i) {
    TrainSequence s;
    std::vector<int32_t> digits;
    for (int j = 0; j < 4; ++j) digits.push_back(int32_t(2 + g() % 10));
    s.tokens = {1};
    s.tokens.insert(s.tokens.end(), digits.begin(), digits.end());
    s.tokens.push_back(20);
    s.prompt_len = int32_t(s.tokens.size());
    s.tokens.insert(s.tokens.end(), digits.rbegin(), digits.rend());
    s.tokens.push_back(0);
    out.push_back(s);
  }
  return out;
}

std::unique_ptr<Trainer> make_trainer(const Context& ctx,
                                      int64_t logits_chunk = TrainerConfig{}.logits_chunk) {
  const ModelConfig c = tiny_moe();
  ParamLayout layout(c);
  Buffer params = alloc_params(layout);
  init_params(layout, params.as<float>(), 1234, 0.1f);
  TrainerConfig tc;
  tc.optim.lr = 3e-3;
  tc.optim.weight_decay = 0.01;
  tc.optim.grad_clip = 0.5;
  tc.micro_batch_tokens = 40;  // several micro-batches per step
  tc.logits_chunk = logits_chunk;
  return std::make_unique<Trainer>(ctx, c, std::move(params), tc);
}

// Whole SFT steps (run_pass's losses on host copies of the logprobs, the
// gradients zeroed by the allocator, AdamW with clipping) and scoring, strict:
// a host read of device memory anywhere would end the test.
TEST(GpuTrainerMemory, SftStepsAndScoresOnStrictDeviceMemoryMatchTheCpu) {
  const emu::ScopedOptions strict(strict_options());
  auto cpu = make_trainer(Context{});
  auto dev = make_trainer(device_context());
  const auto data = dataset(12, 5);
  for (int step = 0; step < 3; ++step) {
    const std::vector<TrainSequence> batch(data.begin() + 4 * step, data.begin() + 4 * step + 4);
    const SftStepStats a = sft_step(*cpu, batch), b = sft_step(*dev, batch);
    EXPECT_EQ(std::memcmp(&a.loss, &b.loss, sizeof(double)), 0) << "loss, step " << step;
    EXPECT_EQ(std::memcmp(&a.grad_norm, &b.grad_norm, sizeof(double)), 0) << "grad norm, step " << step;
    EXPECT_FALSE(b.skipped);
  }
  const size_t n = size_t(ParamLayout(tiny_moe()).numel());
  std::vector<float> got(n);
  device().copy_out(got.data(), dev->checkpoint_params(), n * 4);
  EXPECT_EQ(std::memcmp(got.data(), cpu->checkpoint_params(), n * 4), 0) << "parameters differ";
  ScoreOptions so;
  so.entropy = true;
  const auto sa = cpu->score(data, so), sb = dev->score(data, so);
  ASSERT_EQ(sa.size(), sb.size());
  for (size_t i = 0; i < sa.size(); ++i) {
    ASSERT_EQ(sa[i].logp.size(), sb[i].logp.size());
    EXPECT_EQ(std::memcmp(sa[i].logp.data(), sb[i].logp.data(), sa[i].logp.size() * 4), 0)
        << "sequence " << i;
    EXPECT_EQ(std::memcmp(sa[i].entropy.data(), sb[i].entropy.data(), sa[i].entropy.size() * 4), 0);
  }
}

// A loss with an entropy term, so the chunked head's backward takes both
// dlogp and dentropy: mean of -logp - 0.05 * entropy over each sequence.
double entropy_loss(size_t, const float* logp, const float* entropy, int64_t n, float* dlogp,
                    float* dentropy) {
  double total = 0;
  for (int64_t i = 0; i < n; ++i) {
    total += (-double(logp[i]) - 0.05 * double(entropy[i])) / double(n);
    dlogp[i] = -1.0f / float(n);
    dentropy[i] = -0.05f / float(n);
  }
  return total;
}

// The interpret backend with its column-block entry counted, to see that a
// device trainer takes the chunked head (the unchunked one has the same bits).
std::atomic<int> cols_calls{0};
void counted_cols(const Context& ctx, Tensor dlogits, const Tensor& dlogp, const Tensor& dentropy,
                  const Tensor& logits, const Tensor& targets, const Tensor& stats, int64_t col0,
                  float temperature) {
  ++cols_calls;
  kernels::interpret_backend().token_logprob_backward_cols(ctx, dlogits, dlogp, dentropy, logits, targets,
                                                           stats, col0, temperature);
}
const kernels::GpuBackend& counting_backend() {
  static const kernels::GpuBackend b = [] {
    kernels::GpuBackend c = kernels::interpret_backend();
    c.token_logprob_backward_cols = counted_cols;
    return c;
  }();
  return b;
}

// The chunked LM head (logits_chunk below the micro-batch's rows: row
// blocks for the input gradient, column blocks from the row statistics for
// lm_head's) trains on strict device memory with the CPU's bits, and at
// every chunk the unchunked head's bits.
TEST(GpuTrainerMemory, ChunkedHeadStepsOnStrictDeviceMemoryMatchTheCpu) {
  const emu::ScopedOptions strict(strict_options());
  auto whole = make_trainer(Context{}, 0);
  auto cpu = make_trainer(Context{}, 3);
  Context counted;
  counted.gpu = &counting_backend();
  auto dev = make_trainer(counted, 3);
  const auto data = dataset(8, 9);
  cols_calls = 0;
  ScoreOptions so;
  so.entropy = true;
  so.temperature = 0.9f;
  for (int step = 0; step < 2; ++step) {
    const std::vector<TrainSequence> batch(data.begin() + 4 * step, data.begin() + 4 * step + 4);
    std::vector<double> loss;
    std::vector<OptimizerStats> stats;
    for (Trainer* t : {whole.get(), cpu.get(), dev.get()}) {
      loss.push_back(t->accumulate(batch, entropy_loss, so));
      stats.push_back(t->step());
    }
    for (size_t k : {0, 2}) {
      EXPECT_EQ(std::memcmp(&loss[k], &loss[1], sizeof(double)), 0)
          << "loss, step " << step << ", trainer " << k;
      EXPECT_EQ(std::memcmp(&stats[k].grad_norm, &stats[1].grad_norm, sizeof(double)), 0)
          << "grad norm, step " << step << ", trainer " << k;
    }
    EXPECT_FALSE(stats[2].skipped);
  }
  EXPECT_GT(cols_calls.load(), 0) << "the device trainer did not take the chunked head";
  const size_t n = size_t(ParamLayout(tiny_moe()).numel());
  std::vector<float> got(n);
  device().copy_out(got.data(), dev->checkpoint_params(), n * 4);
  EXPECT_EQ(std::memcmp(got.data(), cpu->checkpoint_params(), n * 4), 0) << "device parameters differ";
  EXPECT_EQ(std::memcmp(whole->checkpoint_params(), cpu->checkpoint_params(), n * 4), 0)
      << "chunked and unchunked parameters differ";
}

// The critic (PPO's value model) on strict device memory: the value head
// reads a copy of the body's final rows and hands back their gradient by a
// copy, the body's norm comes from host chunks; values, losses, norms and
// parameters are the CPU critic's bit for bit.
TEST(GpuTrainerMemory, CriticStepsOnStrictDeviceMemoryMatchTheCpu) {
  const emu::ScopedOptions strict(strict_options());
  const ModelConfig c = tiny_moe();
  CriticConfig cc;
  cc.optim.lr = 1e-2;
  cc.optim.grad_clip = 0.5;
  cc.micro_batch_tokens = 40;
  std::vector<std::unique_ptr<Critic>> critics;
  for (const Context& ctx : {Context{}, device_context()}) {
    ParamLayout layout(c);
    Buffer params = alloc_params(layout);
    init_params(layout, params.as<float>(), 77, 0.1f);
    critics.push_back(std::make_unique<Critic>(ctx, c, std::move(params), cc));
  }
  const auto data = dataset(8, 13);
  // vpred pulled towards 1 at every token: a gradient through head and body.
  const ValueLossFn loss = [](size_t, const float* v, int64_t n, float* dv) {
    double total = 0;
    for (int64_t t = 0; t < n; ++t) {
      total += 0.5 * (double(v[t]) - 1.0) * (double(v[t]) - 1.0) / double(n);
      dv[t] = float((double(v[t]) - 1.0) / double(n));
    }
    return total;
  };
  for (int step = 0; step < 3; ++step) {
    const std::vector<TrainSequence> batch(data.begin() + 2 * step, data.begin() + 2 * step + 4);
    double l[2];
    OptimizerStats st[2];
    for (int k = 0; k < 2; ++k) {
      l[k] = critics[size_t(k)]->accumulate(batch, loss);
      st[k] = critics[size_t(k)]->step();
    }
    EXPECT_EQ(std::memcmp(&l[0], &l[1], sizeof(double)), 0) << "value loss, step " << step;
    EXPECT_EQ(std::memcmp(&st[0].grad_norm, &st[1].grad_norm, sizeof(double)), 0)
        << "grad norm, step " << step;
    EXPECT_FALSE(st[1].skipped);
  }
  const auto va = critics[0]->values(data), vb = critics[1]->values(data);
  ASSERT_EQ(va.size(), vb.size());
  bool nonzero = false;
  for (size_t i = 0; i < va.size(); ++i) {
    ASSERT_EQ(va[i].size(), vb[i].size());
    EXPECT_EQ(std::memcmp(va[i].data(), vb[i].data(), va[i].size() * 4), 0) << "values of sequence " << i;
    for (float x : va[i]) nonzero = nonzero || x != 0.0f;
  }
  EXPECT_TRUE(nonzero) << "the value head did not train";
  const size_t n = size_t(ParamLayout(c).numel());
  std::vector<float> got(n);
  device().copy_out(got.data(), critics[1]->body().checkpoint_params(), n * 4);
  EXPECT_EQ(std::memcmp(got.data(), critics[0]->body().checkpoint_params(), n * 4), 0)
      << "body parameters differ";
  // Save: the same files, byte for byte; the device critic loads the CPU's.
  const std::string dir = temp_dir("critic");
  critics[0]->save(dir + "/cpu");
  critics[1]->save(dir + "/dev");
  for (const char* f : {"model.safetensors", "value_head.safetensors", "optimizer.bin"})
    EXPECT_TRUE(file_bytes(dir + "/cpu/" + f) == file_bytes(dir + "/dev/" + f)) << f << " differs";
  critics[1]->load(dir + "/cpu");
  const auto vc = critics[1]->values(data);
  for (size_t i = 0; i < va.size(); ++i)
    EXPECT_EQ(std::memcmp(va[i].data(), vc[i].data(), va[i].size() * 4), 0)
        << "loaded values of sequence " << i;
  fs::remove_all(dir);
}

// A device trainer resumes from a checkpoint (load_checkpoint: the
// parameters read on the host and copied in, the optimizer state streamed):
// the next step gives the bits of the trainer that wrote it.
TEST(GpuTrainerMemory, DeviceTrainerResumesFromItsCheckpointWithTheSameBits) {
  const emu::ScopedOptions strict(strict_options());
  auto dev = make_trainer(device_context());
  const auto data = dataset(8, 21);
  sft_step(*dev, std::vector<TrainSequence>(data.begin(), data.begin() + 4));
  const std::string dir = temp_dir("resume");
  save_checkpoint(dir, 1, *dev, nlohmann::json::object());
  auto resumed = make_trainer(device_context());
  const auto info = find_latest_checkpoint(dir);
  ASSERT_TRUE(info.has_value());
  load_checkpoint(*info, *resumed);
  const std::vector<TrainSequence> next(data.begin() + 4, data.end());
  const SftStepStats a = sft_step(*dev, next), b = sft_step(*resumed, next);
  EXPECT_EQ(std::memcmp(&a.loss, &b.loss, sizeof(double)), 0) << "loss after the resume";
  EXPECT_EQ(std::memcmp(&a.grad_norm, &b.grad_norm, sizeof(double)), 0) << "grad norm after the resume";
  const size_t n = size_t(ParamLayout(tiny_moe()).numel());
  std::vector<float> want(n), got(n);
  device().copy_out(want.data(), dev->checkpoint_params(), n * 4);
  device().copy_out(got.data(), resumed->checkpoint_params(), n * 4);
  EXPECT_EQ(std::memcmp(want.data(), got.data(), n * 4), 0) << "parameters after the resumed step differ";
  fs::remove_all(dir);
}

}  // namespace
}  // namespace lockstep::train
