// logprobs: the per-position next-token log-probabilities llama.cpp gives a
// GGUF model on given token ids — the llama.cpp side of check_logprobs.py.
//
//   logprobs MODEL.gguf IN.txt [--threads N] [--kv f32|f16] [--fa on|off]
//
// IN.txt holds one sequence per line, token ids separated by spaces or commas.
// For each sequence t_0..t_{n-1} it evaluates all n tokens in one llama_decode
// (fresh KV cache, positions 0..n-1, logits at every position) and prints one
// line: log softmax(logits_i)[t_{i+1}] for i = 0..n-2, i.e. the log-probability
// of every token after the first, as `lockstep score` reports the response
// tokens of prompt_ids = [t_0], response_ids = [t_1..]. The log-softmax is taken
// in double from llama.cpp's f32 logits.
// Built by setup.sh against the static llama.cpp libraries.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "llama.h"

static void quiet_log(ggml_log_level level, const char* text, void*) {
  if (level >= GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s MODEL.gguf IN.txt [--threads N] [--kv f32|f16] [--fa on|off]\n", argv[0]);
    return 2;
  }
  int threads = 2;
  ggml_type kv = GGML_TYPE_F32;
  llama_flash_attn_type fa = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  for (int i = 3; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--threads") threads = std::atoi(v.c_str());
    else if (k == "--kv") kv = v == "f16" ? GGML_TYPE_F16 : GGML_TYPE_F32;
    else if (k == "--fa") fa = v == "on" ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    else { fprintf(stderr, "unknown flag %s\n", k.c_str()); return 2; }
  }

  std::vector<std::vector<llama_token>> seqs;
  std::ifstream in(argv[2]);
  if (!in) { fprintf(stderr, "cannot read %s\n", argv[2]); return 2; }
  size_t max_len = 1;
  for (std::string line; std::getline(in, line);) {
    for (char& c : line) if (c == ',') c = ' ';
    std::istringstream ss(line);
    std::vector<llama_token> s;
    for (long t; ss >> t;) s.push_back(llama_token(t));
    if (s.empty()) continue;
    max_len = std::max(max_len, s.size());
    seqs.push_back(std::move(s));
  }

  llama_log_set(quiet_log, nullptr);
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  mp.progress_callback = [](float, void*) { return true; };  // no progress dots
  llama_model* model = llama_model_load_from_file(argv[1], mp);
  if (!model) { fprintf(stderr, "cannot load %s\n", argv[1]); return 1; }
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = uint32_t((max_len + 255) / 256 * 256);
  cp.n_batch = cp.n_ubatch = cp.n_ctx;
  cp.n_seq_max = 1;
  cp.n_threads = cp.n_threads_batch = threads;
  cp.type_k = cp.type_v = kv;
  cp.flash_attn_type = fa;
  cp.no_perf = true;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (!ctx) { fprintf(stderr, "cannot create a context\n"); return 1; }
  const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

  for (const auto& s : seqs) {
    for (llama_token t : s)
      if (t < 0 || t >= n_vocab) { fprintf(stderr, "token %d out of range [0, %d)\n", t, n_vocab); return 1; }
    llama_memory_clear(llama_get_memory(ctx), true);
    llama_batch b = llama_batch_init(int32_t(s.size()), 0, 1);
    b.n_tokens = int32_t(s.size());
    for (size_t i = 0; i < s.size(); ++i) {
      b.token[i] = s[i];
      b.pos[i] = llama_pos(i);
      b.n_seq_id[i] = 1;
      b.seq_id[i][0] = 0;
      b.logits[i] = 1;
    }
    if (llama_decode(ctx, b) != 0) { fprintf(stderr, "llama_decode failed\n"); return 1; }
    std::string out;
    char buf[32];
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      const float* l = llama_get_logits_ith(ctx, int32_t(i));
      double m = l[0];
      for (int v = 1; v < n_vocab; ++v) m = std::max(m, double(l[v]));
      double z = 0;
      for (int v = 0; v < n_vocab; ++v) z += std::exp(double(l[v]) - m);
      snprintf(buf, sizeof buf, "%s%.9g", i ? " " : "", double(l[s[i + 1]]) - m - std::log(z));
      out += buf;
    }
    puts(out.c_str());
    llama_batch_free(b);
  }
  llama_free(ctx);
  llama_model_free(model);
  llama_backend_free();
  return 0;
}
