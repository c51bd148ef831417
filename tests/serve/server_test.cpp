// `lockstep serve` end to end: the real binary ($LOCKSTEP_BIN) serves a tiny
// MoE model made by `lockstep init`, and real HTTP requests over loopback
// check the SGLang and OpenAI APIs, errors, auth, weight updates, concurrency,
// memory after a burst, and graceful shutdown.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const char* kApiKey = "test-key-123";

std::string lockstep_bin() {
  const char* b = std::getenv("LOCKSTEP_BIN");
  return b ? b : "";
}

// A `lockstep serve` child process; its first stdout line names the port.
class ServerProcess {
 public:
  explicit ServerProcess(const std::vector<std::string>& extra) {
    std::vector<std::string> args = {lockstep_bin(), "serve", "--port", "0", "--threads", "1"};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    int out[2];
    if (pipe(out) != 0) throw std::runtime_error("pipe");
    // fork + exec rather than posix_spawn: the child asks to be killed when
    // this process dies, so a crashed test leaves no server holding ctest's
    // output pipe (ctest would then wait for its timeout).
    const pid_t parent = getpid();
    pid_ = fork();
    if (pid_ < 0) throw std::runtime_error("cannot fork for " + args[0]);
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(127);
      dup2(out[1], 1);
      close(out[0]);
      close(out[1]);
      execve(argv[0], argv.data(), environ);
      _exit(127);
    }
    close(out[1]);
    out_fd_ = out[0];
    // Read until the "listening on http://127.0.0.1:PORT" line (30 s at most).
    std::string text;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (text.find('\n') == std::string::npos && std::chrono::steady_clock::now() < deadline) {
      pollfd p{out_fd_, POLLIN, 0};
      if (poll(&p, 1, 200) <= 0) continue;
      char buf[512];
      ssize_t n = read(out_fd_, buf, sizeof buf);
      if (n <= 0) break;
      text.append(buf, size_t(n));
    }
    const std::string key = "http://127.0.0.1:";
    size_t at = text.find(key);
    if (at == std::string::npos) throw std::runtime_error("server did not start; stdout: " + text);
    port_ = std::atoi(text.c_str() + at + key.size());
  }
  ~ServerProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (out_fd_ >= 0) close(out_fd_);
  }
  int port() const { return port_; }
  pid_t pid() const { return pid_; }

  // SIGTERM, then the exit status (-1: did not exit in time, killed).
  int terminate(double timeout_s) {
    kill(pid_, SIGTERM);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return -1;
  }

  // Resident set size in KiB, from /proc/<pid>/status.
  int64_t rss_kib() const {
    std::ifstream f("/proc/" + std::to_string(pid_) + "/status");
    std::string line;
    while (std::getline(f, line))
      if (line.rfind("VmRSS:", 0) == 0) return std::atoll(line.c_str() + 6);
    return -1;
  }

 private:
  pid_t pid_ = -1;
  int out_fd_ = -1;
  int port_ = 0;
};

void run_ok(const std::string& cmd) {
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

// Tiny Qwen3-MoE models written by `lockstep init`, one server for the suite.
class ServeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ASSERT_FALSE(lockstep_bin().empty()) << "LOCKSTEP_BIN is not set (ctest sets it)";
    dir_ = fs::temp_directory_path() / ("lockstep_serve_test_" + std::to_string(getpid()));
    fs::create_directories(dir_);
    const std::string toml = R"([model]
architecture = "Qwen3MoeForCausalLM"
vocab_size = 300
hidden_size = 64
num_layers = 2
num_heads = 4
num_kv_heads = 2
head_dim = 16
intermediate_size = 128
qk_norm = true
max_position_embeddings = 256
num_experts = 4
num_experts_per_tok = 2
moe_intermediate_size = 64
init_std = 0.5
)";
    std::ofstream(dir_ / "tiny.toml") << toml;
    const std::string bin = lockstep_bin(), cfg = (dir_ / "tiny.toml").string();
    run_ok(bin + " init --config " + cfg + " --out " + (dir_ / "m1").string() + " --seed 1 > /dev/null");
    run_ok(bin + " init --config " + cfg + " --out " + (dir_ / "m2").string() + " --seed 2 > /dev/null");
    // A long context for generations that run for thousands of steps.
    run_ok(bin + " init --config " + cfg + " --set model.max_position_embeddings=4096 --out " +
           (dir_ / "long").string() + " --seed 1 > /dev/null");
    run_ok(bin + " init --config " + cfg + " --set model.max_position_embeddings=4096 --out " +
           (dir_ / "long2").string() + " --seed 2 > /dev/null");
    // A different architecture (wider) that an update must refuse.
    run_ok(bin + " init --config " + cfg + " --set model.hidden_size=96 --out " + (dir_ / "wide").string() +
           " > /dev/null");
    server_ = new ServerProcess({"--model", (dir_ / "m1").string(), "--api-key", kApiKey, "--http-threads",
                                 "32", "--max-body-bytes", "1048576", "--kv-blocks", "512", "--seed", "5"});
  }
  static void TearDownTestSuite() {
    if (server_) {
      // Graceful shutdown: SIGTERM ends the process with status 0.
      EXPECT_EQ(server_->terminate(20), 0);
      delete server_;
      server_ = nullptr;
    }
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  static httplib::Client client(bool with_key = true) {
    httplib::Client c("127.0.0.1", server_->port());
    c.set_read_timeout(60, 0);
    c.set_connection_timeout(5, 0);
    c.set_tcp_nodelay(true);  // else Nagle + delayed ACK add ~40 ms per request
    if (with_key) c.set_bearer_token_auth(kApiKey);
    return c;
  }
  static json post(const std::string& path, const json& body, int expect_status = 200) {
    auto c = client();
    auto r = c.Post(path.c_str(), body.dump(), "application/json");
    EXPECT_TRUE(r) << path << ": no response";
    if (!r) return json();
    EXPECT_EQ(r->status, expect_status) << path << " " << body.dump() << " -> " << r->body;
    return json::parse(r->body, nullptr, false);
  }
  // Server-Sent Events of a streamed POST: the JSON of every `data:` line
  // before [DONE]; *done tells whether [DONE] came.
  static std::vector<json> post_stream(const std::string& path, const json& body, bool* done) {
    auto c = client();
    std::string raw;
    httplib::Request req;
    req.method = "POST";
    req.path = path;
    req.body = body.dump();
    req.set_header("Content-Type", "application/json");
    req.set_header("Authorization", std::string("Bearer ") + kApiKey);
    req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
      raw.append(d, n);
      return true;
    };
    auto r = c.send(req);
    EXPECT_TRUE(r);
    if (r) {
      EXPECT_EQ(r->status, 200);
    }
    std::vector<json> events;
    *done = false;
    std::istringstream is(raw);
    std::string line;
    while (std::getline(is, line)) {
      if (line.rfind("data: ", 0) != 0) continue;
      std::string payload = line.substr(6);
      if (payload == "[DONE]") {
        *done = true;
        continue;
      }
      EXPECT_FALSE(*done) << "data after [DONE]";
      events.push_back(json::parse(payload));
    }
    return events;
  }
  static std::vector<int32_t> ids(const json& item) { return item["output_ids"].get<std::vector<int32_t>>(); }
  static json greedy_body(int max_new = 16) {
    return {{"input_ids", {10, 20, 30, 40, 50}},
            {"sampling_params", {{"temperature", 0}, {"max_new_tokens", max_new}}}};
  }

  static inline fs::path dir_;
  static inline ServerProcess* server_ = nullptr;
};

TEST_F(ServeTest, HealthIsOpenAndAuthIsEnforced) {
  auto open = client(false);
  auto h = open.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  auto hg = open.Get("/health_generate");
  ASSERT_TRUE(hg);
  EXPECT_EQ(hg->status, 200) << hg->body;

  auto r = open.Post("/generate", greedy_body().dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  json e = json::parse(r->body);
  EXPECT_TRUE(e["error"]["message"].is_string());
  httplib::Client wrong("127.0.0.1", server_->port());
  wrong.set_bearer_token_auth("nope");
  auto w = wrong.Get("/get_model_info");
  ASSERT_TRUE(w);
  EXPECT_EQ(w->status, 401);
  auto ok = client().Get("/get_model_info");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
}

TEST_F(ServeTest, GreedyGenerateIsReproducible) {
  json a = post("/generate", greedy_body());
  json b = post("/generate", greedy_body());
  ASSERT_TRUE(a.contains("output_ids"));
  EXPECT_EQ(ids(a).size(), 16u);
  EXPECT_EQ(ids(a), ids(b));
  EXPECT_EQ(a["text"], b["text"]);
  const json& m = a["meta_info"];
  EXPECT_EQ(m["prompt_tokens"], 5);
  EXPECT_EQ(m["completion_tokens"], 16);
  EXPECT_EQ(m["finish_reason"]["type"], "length");
  EXPECT_TRUE(m["weight_version"].is_number_integer());
  EXPECT_TRUE(m["id"].is_string());
  // Text prompts are tokenized by the server.
  json t = post("/generate",
                {{"text", "Hello"}, {"sampling_params", {{"temperature", 0}, {"max_new_tokens", 4}}}});
  EXPECT_EQ(t["meta_info"]["prompt_tokens"], 5);  // byte-level: one token per byte
  EXPECT_EQ(ids(t),
            ids(post("/generate", {{"input_ids", {72, 101, 108, 108, 111}},
                                   {"sampling_params", {{"temperature", 0}, {"max_new_tokens", 4}}}})));
}

TEST_F(ServeTest, SeededSamplingIsReproducibleAndBatchesAreLists) {
  json body = {{"input_ids", {{1, 2, 3}, {4, 5, 6, 7}}},
               {"sampling_params", {{"temperature", 1.0}, {"max_new_tokens", 12}, {"n", 3}, {"seed", 1234}}},
               {"return_logprob", true}};
  json a = post("/generate", body);
  json b = post("/generate", body);
  ASSERT_TRUE(a.is_array());
  ASSERT_EQ(a.size(), 6u);  // 2 prompts x n=3, prompt-major
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(ids(a[i]), ids(b[i])) << i;
    const json& lp = a[i]["meta_info"]["output_token_logprobs"];
    ASSERT_EQ(lp.size(), ids(a[i]).size());
    for (size_t j = 0; j < lp.size(); ++j) {
      EXPECT_LE(lp[j][0].get<double>(), 0.0);
      EXPECT_EQ(lp[j][1].get<int32_t>(), ids(a[i])[j]);
      EXPECT_TRUE(lp[j][2].is_null());
    }
    EXPECT_EQ(a[i]["meta_info"]["prompt_tokens"], i < 3 ? 3 : 4);
  }
  EXPECT_EQ(a[0]["meta_info"]["output_token_logprobs"], b[0]["meta_info"]["output_token_logprobs"]);
  // The samples of one prompt draw from different streams.
  EXPECT_NE(ids(a[0]), ids(a[1]));
  body["sampling_params"]["seed"] = 99;
  json c = post("/generate", body);
  EXPECT_NE(ids(a[0]), ids(c[0]));
}

TEST_F(ServeTest, StreamingYieldsTheSameTokens) {
  json body = {{"input_ids", {7, 8, 9}},
               {"sampling_params", {{"temperature", 0.8}, {"max_new_tokens", 20}, {"seed", 42}, {"n", 2}}},
               {"return_logprob", true}};
  json full = post("/generate", body);
  ASSERT_TRUE(full.is_array());
  body["stream"] = true;
  bool done = false;
  auto events = post_stream("/generate", body, &done);
  EXPECT_TRUE(done);
  // Per sample: one chunk per token, then the final item.
  std::map<int, std::vector<json>> by_index;
  for (const auto& e : events) by_index[e["index"].get<int>()].push_back(e);
  ASSERT_EQ(by_index.size(), 2u);
  for (int k = 0; k < 2; ++k) {
    const auto& ev = by_index[k];
    ASSERT_FALSE(ev.empty());
    const json& last = ev.back();
    EXPECT_EQ(ids(last), ids(full[size_t(k)])) << k;
    EXPECT_EQ(last["text"], full[size_t(k)]["text"]);
    EXPECT_EQ(last["meta_info"]["finish_reason"], full[size_t(k)]["meta_info"]["finish_reason"]);
    EXPECT_EQ(last["meta_info"]["output_token_logprobs"],
              full[size_t(k)]["meta_info"]["output_token_logprobs"]);
    EXPECT_EQ(ev.size(), ids(last).size() + 1);
    for (size_t j = 0; j + 1 < ev.size(); ++j) {
      EXPECT_TRUE(ev[j]["meta_info"]["finish_reason"].is_null());
      EXPECT_EQ(ids(ev[j]).size(), j + 1);  // cumulative ids, one more per chunk
    }
  }

  // OpenAI completions: the streamed deltas add up to the non-streamed text.
  json cbody = {{"prompt", "Once upon"}, {"max_tokens", 24}, {"temperature", 0.9}, {"seed", 7}};
  json c = post("/v1/completions", cbody);
  cbody["stream"] = true;
  cbody["stream_options"] = {{"include_usage", true}};
  auto cev = post_stream("/v1/completions", cbody, &done);
  EXPECT_TRUE(done);
  std::string text, finish;
  json usage;
  for (const auto& e : cev) {
    EXPECT_EQ(e["object"], "text_completion");
    if (e.contains("usage") && !e["usage"].is_null()) usage = e["usage"];
    for (const auto& ch : e["choices"]) {
      text += ch["text"].get<std::string>();
      if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
    }
  }
  EXPECT_EQ(text, c["choices"][0]["text"].get<std::string>());
  EXPECT_EQ(finish, c["choices"][0]["finish_reason"].get<std::string>());
  EXPECT_EQ(usage, c["usage"]);
}

TEST_F(ServeTest, StopTokensAndStopStrings) {
  json g = post("/generate", greedy_body(40));
  const auto greedy = ids(g);
  ASSERT_EQ(greedy.size(), 40u);
  // A stop token: the output ends with it, matched names it.
  json st = greedy_body(40);
  st["sampling_params"]["stop_token_ids"] = {greedy[5]};
  json s = post("/generate", st);
  const auto out = ids(s);
  ASSERT_FALSE(out.empty());
  EXPECT_EQ(out.back(), greedy[5]);
  EXPECT_EQ(std::vector<int32_t>(greedy.begin(), greedy.begin() + long(out.size())), out);
  EXPECT_EQ(s["meta_info"]["finish_reason"]["type"], "stop");
  EXPECT_EQ(s["meta_info"]["finish_reason"]["matched"], greedy[5]);

  // A stop string: the first printable ASCII byte of the greedy output (ids
  // 0..255 are bytes). Earlier tokens cannot contain that character.
  size_t k = 0;
  while (k < greedy.size() && !(greedy[k] >= 33 && greedy[k] < 127)) ++k;
  if (k == greedy.size()) GTEST_SKIP() << "no printable byte in the greedy output";
  const std::string stop(1, char(greedy[k]));
  json sb = greedy_body(40);
  sb["sampling_params"]["stop"] = stop;
  json r = post("/generate", sb);
  EXPECT_EQ(ids(r), std::vector<int32_t>(greedy.begin(), greedy.begin() + long(k) + 1));
  EXPECT_EQ(r["meta_info"]["finish_reason"]["matched"], stop);
  // The text stops before the stop string: it is the text of the first k tokens.
  std::string before;
  if (k > 0) before = post("/generate", greedy_body(int(k)))["text"];
  EXPECT_EQ(r["text"], before);
  sb["sampling_params"]["no_stop_trim"] = true;
  EXPECT_EQ(post("/generate", sb)["text"], before + stop);

  // Streamed through the OpenAI API, the stop string is never sent.
  json cb = {{"prompt", std::vector<int>{10, 20, 30, 40, 50}},
             {"max_tokens", 40},
             {"temperature", 0},
             {"stop", {stop}},
             {"stream", true}};
  bool done = false;
  std::string text;
  for (const auto& e : post_stream("/v1/completions", cb, &done))
    for (const auto& ch : e["choices"]) text += ch["text"].get<std::string>();
  EXPECT_TRUE(done);
  EXPECT_EQ(text, before);
}

TEST_F(ServeTest, OpenAiEndpointsAreWellFormed) {
  json c = post("/v1/completions", {{"model", "whatever"},
                                    {"prompt", {"Hello", "World!"}},
                                    {"max_tokens", 6},
                                    {"n", 2},
                                    {"temperature", 0.7},
                                    {"seed", 3},
                                    {"logprobs", 0}});
  EXPECT_EQ(c["object"], "text_completion");
  EXPECT_TRUE(c["id"].is_string());
  EXPECT_TRUE(c["created"].is_number_integer());
  ASSERT_EQ(c["choices"].size(), 4u);
  int64_t completion = 0;
  for (size_t i = 0; i < 4; ++i) {
    const json& ch = c["choices"][i];
    EXPECT_EQ(ch["index"], i);
    EXPECT_TRUE(ch["text"].is_string());
    EXPECT_TRUE(ch["finish_reason"] == "length" || ch["finish_reason"] == "stop");
    const json& lp = ch["logprobs"];
    EXPECT_EQ(lp["tokens"].size(), lp["token_logprobs"].size());
    EXPECT_EQ(lp["text_offset"].size(), lp["tokens"].size());
    completion += int64_t(lp["tokens"].size());
  }
  EXPECT_EQ(c["usage"]["prompt_tokens"], 5 + 6);
  EXPECT_EQ(c["usage"]["completion_tokens"], completion);
  EXPECT_EQ(c["usage"]["total_tokens"], 11 + completion);

  json chat_body = {{"model", "m"},
                    {"messages",
                     {{{"role", "system"}, {"content", "Be brief."}},
                      {{"role", "user"}, {"content", {{{"type", "text"}, {"text", "Hi there"}}}}}}},
                    {"max_tokens", 8},
                    {"temperature", 0},
                    {"logprobs", true},
                    {"top_logprobs", 0}};
  json chat = post("/v1/chat/completions", chat_body);
  EXPECT_EQ(chat["object"], "chat.completion");
  ASSERT_EQ(chat["choices"].size(), 1u);
  const json& msg = chat["choices"][0]["message"];
  EXPECT_EQ(msg["role"], "assistant");
  EXPECT_TRUE(msg["content"].is_string());
  const int64_t n_out = chat["usage"]["completion_tokens"];
  EXPECT_EQ(chat["choices"][0]["logprobs"]["content"].size(), size_t(n_out));
  EXPECT_GT(chat["usage"]["prompt_tokens"].get<int64_t>(), 10);  // the ChatML template adds its markers

  json chat_ids = chat_body;
  chat_ids["return_tokens_as_token_ids"] = true;
  chat_ids["top_logprobs"] = 2;
  const json by_ids = post("/v1/chat/completions", chat_ids);  // kept: the loop reads into it
  const json& id_content = by_ids["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(id_content.size(), size_t(n_out));
  for (const auto& t : id_content) {
    EXPECT_EQ(t["token"].get<std::string>().rfind("token_id:", 0), 0u) << t.dump();
    ASSERT_EQ(t["top_logprobs"].size(), 2u) << t.dump();
    for (const auto& alt : t["top_logprobs"])
      EXPECT_EQ(alt["token"].get<std::string>().rfind("token_id:", 0), 0u) << t.dump();
  }
  chat_body["stream"] = true;
  bool done = false;
  auto ev = post_stream("/v1/chat/completions", chat_body, &done);
  EXPECT_TRUE(done);
  ASSERT_FALSE(ev.empty());
  EXPECT_EQ(ev[0]["object"], "chat.completion.chunk");
  EXPECT_EQ(ev[0]["choices"][0]["delta"]["role"], "assistant");
  std::string content;
  for (const auto& e : ev)
    for (const auto& ch : e["choices"])
      if (ch["delta"].contains("content")) content += ch["delta"]["content"].get<std::string>();
  EXPECT_EQ(content, msg["content"].get<std::string>());
  EXPECT_EQ(ev.back()["choices"][0]["finish_reason"], chat["choices"][0]["finish_reason"]);

  auto models = client().Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(json::parse(models->body)["data"][0]["object"], "model");
}

// Top-N alternatives and prompt logprobs through every API: the shapes each
// client expects, the same numbers in each, and prompt logprobs equal to
// `lockstep score`'s of the same ids (the trainer's forward), bit for bit.
TEST_F(ServeTest, TopAndPromptLogprobsAcrossTheApis) {
  const std::vector<int32_t> prompt = {72, 101, 108, 108, 111, 32, 119};
  json g = post("/generate", {{"input_ids", prompt},
                              {"sampling_params", {{"temperature", 0}, {"max_new_tokens", 6}}},
                              {"return_logprob", true},
                              {"top_logprobs_num", 3},
                              {"logprob_start_len", 0},
                              {"return_text_in_logprobs", true}});
  const json& m = g["meta_info"];
  const std::vector<int32_t> out = ids(g);
  ASSERT_EQ(m["input_token_logprobs"].size(), prompt.size());
  EXPECT_TRUE(m["input_token_logprobs"][0][0].is_null());
  EXPECT_TRUE(m["input_top_logprobs"][0].is_null());
  for (size_t i = 0; i < prompt.size(); ++i) {
    EXPECT_EQ(m["input_token_logprobs"][i][1], prompt[i]);
    EXPECT_TRUE(m["input_token_logprobs"][i][2].is_string());
    if (i > 0) {
      EXPECT_EQ(m["input_top_logprobs"][i].size(), 3u);
    }
  }
  ASSERT_EQ(m["output_top_logprobs"].size(), out.size());
  for (size_t j = 0; j < out.size(); ++j) {
    const json& alts = m["output_top_logprobs"][j];
    ASSERT_EQ(alts.size(), 3u);
    EXPECT_GE(alts[0][0].get<double>(), alts[1][0].get<double>());
    EXPECT_GE(alts[1][0].get<double>(), alts[2][0].get<double>());
    EXPECT_TRUE(alts[0][2].is_string());
    // Greedy: the sampled token is the most likely one.
    EXPECT_EQ(alts[0][1], out[j]);
    EXPECT_EQ(alts[0][0], m["output_token_logprobs"][j][0]);
  }

  // `lockstep score` of prompt[1..] + output given prompt[0].
  const std::string model_path = json::parse(client().Get("/get_model_info")->body)["model_path"];
  const fs::path in = dir_ / "score_in.jsonl", outp = dir_ / "score_out.jsonl";
  std::vector<int32_t> rest(prompt.begin() + 1, prompt.end());
  rest.insert(rest.end(), out.begin(), out.end());
  std::ofstream(in) << json{{"prompt_ids", {prompt[0]}}, {"response_ids", rest}}.dump() << "\n";
  run_ok(lockstep_bin() + " score --model " + model_path + " --input " + in.string() + " --output " +
         outp.string() + " --threads 1 > /dev/null");
  std::ifstream is(outp);
  std::string line;
  std::getline(is, line);
  const std::vector<float> want = json::parse(line)["logprobs"].get<std::vector<float>>();
  ASSERT_EQ(want.size(), rest.size());
  for (size_t i = 1; i < prompt.size(); ++i)
    EXPECT_EQ(m["input_token_logprobs"][i][0].get<float>(), want[i - 1]) << "prompt position " << i;
  for (size_t j = 0; j < out.size(); ++j)
    EXPECT_EQ(m["output_token_logprobs"][j][0].get<float>(), want[prompt.size() - 1 + j]) << "output " << j;

  // Completions, logprobs 5 with echo: the same numbers, OpenAI's shape.
  json c = post("/v1/completions",
                {{"prompt", prompt}, {"max_tokens", 6}, {"temperature", 0}, {"logprobs", 5}, {"echo", true}});
  const json& lp = c["choices"][0]["logprobs"];
  int byte_keys = 0;
  ASSERT_EQ(lp["tokens"].size(), prompt.size() + out.size());
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  for (size_t i = 1; i < lp["tokens"].size(); ++i) {
    const float v = lp["token_logprobs"][i].get<float>();
    EXPECT_EQ(v, want[i - 1]) << i;
    const json& d = lp["top_logprobs"][i];
    ASSERT_TRUE(d.is_object());
    // The five best and the token itself when it is not among them, five
    // distinct keys: a byte >= 0x80 of the byte-level tokenizer (part of a
    // character) is "bytes:\\xNN" as OpenAI writes it, not U+FFFD.
    EXPECT_EQ(d.size(), i < prompt.size() && d.size() == 6u ? 6u : 5u) << d.dump();
    EXPECT_TRUE(d.contains(lp["tokens"][i].get<std::string>()));
    for (auto it = d.begin(); it != d.end(); ++it) {
      EXPECT_EQ(it.key().find("\xEF\xBF\xBD"), std::string::npos) << it.key();  // no U+FFFD
      if (it.key().rfind("bytes:", 0) == 0) {
        ++byte_keys;
        EXPECT_EQ(it.key().size(), 10u) << it.key();  // bytes:\xNN
        EXPECT_EQ(it.key().substr(6, 2), "\\x") << it.key();
      }
    }
    double best = -1e30;
    for (auto it = d.begin(); it != d.end(); ++it) best = std::max(best, it->get<double>());
    EXPECT_GE(best, double(v));
  }
  EXPECT_GT(byte_keys, 0) << "no alternative was a byte >= 0x80";
  EXPECT_EQ(c["choices"][0]["text"].get<std::string>().rfind("Hello w", 0), 0u);

  // vLLM's return_tokens_as_token_ids: every token named token_id:N.
  json ci = post("/v1/completions", {{"prompt", prompt},
                                     {"max_tokens", 6},
                                     {"temperature", 0},
                                     {"logprobs", 5},
                                     {"return_tokens_as_token_ids", true}});
  const json& lpi = ci["choices"][0]["logprobs"];
  ASSERT_EQ(lpi["tokens"].size(), out.size());
  for (size_t j = 0; j < out.size(); ++j) {
    EXPECT_EQ(lpi["tokens"][j], "token_id:" + std::to_string(out[j]));
    ASSERT_EQ(lpi["top_logprobs"][j].size(), 5u);
    for (auto it = lpi["top_logprobs"][j].begin(); it != lpi["top_logprobs"][j].end(); ++it)
      EXPECT_EQ(it.key().rfind("token_id:", 0), 0u) << it.key();
    EXPECT_EQ(lpi["top_logprobs"][j][lpi["tokens"][j].get<std::string>()], lpi["token_logprobs"][j]);
  }

  // Streaming completions: each chunk carries its token's alternatives.
  bool done = false;
  auto ev = post_stream(
      "/v1/completions",
      {{"prompt", prompt}, {"max_tokens", 6}, {"temperature", 0}, {"logprobs", 5}, {"stream", true}}, &done);
  EXPECT_TRUE(done);
  json streamed_top = json::array();
  for (const auto& e : ev)
    for (const auto& ch : e["choices"])
      if (ch["logprobs"].is_object())
        for (const auto& t : ch["logprobs"]["top_logprobs"]) streamed_top.push_back(t);
  ASSERT_EQ(streamed_top.size(), out.size());
  for (size_t j = 0; j < out.size(); ++j)
    EXPECT_EQ(streamed_top[j], lp["top_logprobs"][prompt.size() + j]) << j;

  // Chat, top_logprobs 3, plain and streamed.
  json chat_body = {{"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                    {"max_tokens", 5},
                    {"temperature", 0},
                    {"logprobs", true},
                    {"top_logprobs", 3}};
  json chat = post("/v1/chat/completions", chat_body);
  const json& content = chat["choices"][0]["logprobs"]["content"];
  ASSERT_FALSE(content.empty());
  for (const auto& t : content) {
    ASSERT_EQ(t["top_logprobs"].size(), 3u);
    EXPECT_EQ(t["top_logprobs"][0]["logprob"], t["logprob"]);  // greedy
    EXPECT_TRUE(t["top_logprobs"][2]["bytes"].is_array());
    EXPECT_TRUE(t["top_logprobs"][2]["token"].is_string());
  }
  chat_body["stream"] = true;
  auto cev = post_stream("/v1/chat/completions", chat_body, &done);
  json streamed = json::array();
  for (const auto& e : cev)
    for (const auto& ch : e["choices"])
      if (ch["logprobs"].is_object())
        for (const auto& t : ch["logprobs"]["content"]) streamed.push_back(t);
  EXPECT_EQ(streamed, content);
}

// The processors change what is sampled: a strong logit_bias forces its
// token, the logprobs stay the model's.
TEST_F(ServeTest, LogitBiasAndPenaltiesShapeSampling) {
  json c = post("/v1/completions", {{"prompt", "Hello"},
                                    {"max_tokens", 4},
                                    {"temperature", 1.0},
                                    {"seed", 1},
                                    {"logit_bias", {{"65", 100}}},
                                    {"logprobs", 0}});
  EXPECT_EQ(c["choices"][0]["text"], "AAAA");
  for (const auto& v : c["choices"][0]["logprobs"]["token_logprobs"]) EXPECT_LT(v.get<double>(), -0.001);
  json plain = post("/generate", greedy_body(12));
  json body = greedy_body(12);
  body["sampling_params"]["repetition_penalty"] = 5.0;
  body["sampling_params"]["frequency_penalty"] = 2.0;
  body["sampling_params"]["ignore_eos"] = true;
  EXPECT_NE(ids(post("/generate", body)), ids(plain));
  body = greedy_body(12);
  body["sampling_params"]["min_new_tokens"] = 12;
  EXPECT_EQ(ids(post("/generate", body)).size(), 12u);
}

TEST_F(ServeTest, BadRequestsGet400WithAJsonError) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"/generate", "{\"text\": \"hi\""},                                       // bad JSON
      {"/generate", ""},                                                        // empty body
      {"/generate", "[1, 2]"},                                                  // not an object
      {"/generate", R"({"sampling_params": {"max_new_tokens": 4}})"},           // no prompt
      {"/generate", R"({"text": "a", "input_ids": [1]})"},                      // both
      {"/generate", R"({"text": "a", "bogus": 1})"},                            // unknown top-level key
      {"/generate", R"({"text": "a", "sampling_params": {"temprature": 1}})"},  // unknown sampling key
      {"/generate", R"({"text": "a", "sampling_params": {"temperature": "hot"}})"},
      {"/generate", R"({"text": "a", "sampling_params": {"temperature": -1}})"},
      {"/generate", R"({"text": "a", "sampling_params": {"top_p": 0}})"},
      {"/generate", R"({"text": "a", "sampling_params": {"n": 0}})"},
      {"/generate", R"({"text": "a", "sampling_params": {"max_new_tokens": 0}})"},
      {"/generate", R"({"text": "a", "sampling_params": {"max_new_tokens": 1000}})"},  // past the context
      {"/generate", R"({"text": "a", "sampling_params": {"frequency_penalty": 2.5}})"},
      {"/generate", R"({"text": "a", "top_logprobs_num": 3})"},  // without return_logprob
      {"/generate", R"({"input_ids": [1, 300]})"},               // id out of range
      {"/generate", R"({"input_ids": [1, -1]})"},                // negative id
      {"/generate", R"({"input_ids": [1, 2.5]})"},               // not an integer
      {"/generate", R"({"input_ids": []})"},                     // empty prompt
      {"/generate", R"({"input_ids": [[1], "x"]})"},
      {"/v1/completions", R"({"max_tokens": 4})"},
      {"/v1/completions", R"({"prompt": "a", "logprobs": 21})"},
      {"/v1/completions", R"({"prompt": "a", "logit_bias": {"x": 1}})"},
      {"/v1/completions", R"({"prompt": "a", "echo": true, "logprobs": 1, "stream": true})"},
      {"/v1/completions", R"({"prompt": "a", "max_tokens": 4, "tempreature": 0})"},
      {"/v1/chat/completions", R"({"max_tokens": 4})"},
      {"/v1/chat/completions", R"({"messages": []})"},
      {"/v1/chat/completions", R"({"messages": [{"content": "no role"}]})"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "a"}], "top_logprobs": 3})"},
      {"/update_weights_from_disk", R"({})"},
      {"/update_weights_from_disk", R"({"model_path": "/nonexistent/dir"})"},
  };
  // A prompt longer than the context (256).
  json long_prompt = {{"input_ids", std::vector<int>(300, 5)}};
  std::vector<std::pair<std::string, std::string>> all = cases;
  all.push_back({"/generate", long_prompt.dump()});
  for (const auto& [path, body] : all) {
    auto c = client();
    auto r = c.Post(path.c_str(), body, "application/json");
    ASSERT_TRUE(r) << path << " " << body;
    EXPECT_EQ(r->status, 400) << path << " " << body << " -> " << r->body;
    json e = json::parse(r->body, nullptr, false);
    ASSERT_TRUE(e.is_object()) << r->body;
    EXPECT_TRUE(e["error"]["message"].is_string() && !e["error"]["message"].get<std::string>().empty())
        << r->body;
    EXPECT_EQ(e["error"]["type"], "invalid_request_error") << r->body;
  }
  // Too large a body: 413 with the same error shape.
  auto c = client();
  auto big = c.Post("/generate", std::string(2 << 20, ' '), "application/json");
  ASSERT_TRUE(big);
  EXPECT_EQ(big->status, 413);
  EXPECT_TRUE(json::parse(big->body, nullptr, false)["error"]["message"].is_string()) << big->body;
  auto nf = client().Get("/no/such/path");
  ASSERT_TRUE(nf);
  EXPECT_EQ(nf->status, 404);
  // Still serving.
  EXPECT_EQ(ids(post("/generate", greedy_body(4))).size(), 4u);
}

// Bodies the soak test (tests/serve/soak.py) found answered wrongly: a
// number past double's range was a 500, text after a NUL byte was ignored
// (the request generated), an empty text batch did not name text.
TEST_F(ServeTest, OddJsonGets400NamingTheProblem) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"text": "a", "sampling_params": {"temperature": 1e999}})", "number overflow"},
      {std::string("{\"text\": \"a\"}\0garbage", 21), "NUL"},
      {std::string(100000, '[') + std::string(100000, ']'), "nest 100000 levels"},
      {"{\"text\": " + std::string(64, '[') + std::string(64, ']') + "}", "nest 65 levels"},
      {R"({"text": []})", "text"},
  };
  for (const auto& [body, expect] : cases) {
    auto r = client().Post("/generate", body, "application/json");
    ASSERT_TRUE(r) << body.substr(0, 80);
    EXPECT_EQ(r->status, 400) << body.substr(0, 80) << " -> " << r->body;
    json e = json::parse(r->body, nullptr, false);
    ASSERT_TRUE(e.is_object()) << r->body;
    EXPECT_NE(e["error"]["message"].get<std::string>().find(expect), std::string::npos) << r->body;
  }
  // 64 levels are allowed (the body is then refused for what it holds).
  auto ok_depth = client().Post("/generate", std::string(64, '[') + std::string(64, ']'), "application/json");
  ASSERT_TRUE(ok_depth);
  EXPECT_EQ(json::parse(ok_depth->body)["error"]["message"], "the request body must be a JSON object");
}

// A client trickling its request (each byte well within the 5 s read
// timeout) held an HTTP worker for as long as it liked: with as many such
// clients as workers, nobody else was served. --request-timeout cuts each
// one off (408) so the others get through.
// A TCP connection to 127.0.0.1:port; -1 if it fails.
int connect_loopback(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(uint16_t(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

TEST_F(ServeTest, SlowClientsAreCutOffAtTheRequestTimeout) {
  ServerProcess s({"--model", (dir_ / "m1").string(), "--http-threads", "2", "--request-timeout", "1"});
  std::atomic<int> cut_off{0};
  auto trickle = [&] {
    const int fd = connect_loopback(s.port());
    ASSERT_GE(fd, 0);
    const std::string req = "POST /generate HTTP/1.1\r\nHost: x\r\nX-Slow: " + std::string(200, 'a');
    // One byte per 100 ms for up to 20 s, or until the server closes.
    for (char c : req) {
      if (send(fd, &c, 1, MSG_NOSIGNAL) != 1) break;
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, 100) > 0) break;  // the server answered (or closed)
    }
    char buf[512];
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n > 0 && std::string(buf, size_t(n)).find("HTTP/1.1 408") == 0)
      ++cut_off;
    else
      ADD_FAILURE() << "slow client got " << (n > 0 ? std::string(buf, size_t(n)) : std::to_string(n));
    close(fd);
  };
  std::thread a(trickle), b(trickle);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // both hold a worker now
  httplib::Client c("127.0.0.1", s.port());
  c.set_read_timeout(10, 0);
  auto r = c.Post("/generate", greedy_body(2).dump(), "application/json");
  a.join();
  b.join();
  ASSERT_TRUE(r) << "a normal request got no answer while two slow clients held both workers";
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(cut_off.load(), 2);
}

// Idle keep-alive connections give their worker up while others wait for
// one: with both workers held by clients idle between requests and a
// keep-alive timeout of 60 s, a third client is still answered (without the
// rule it would wait the 60 s and time out), and an idle connection is the
// one the server closed.
TEST_F(ServeTest, IdleKeepAliveConnectionsYieldTheirWorkersUnderLoad) {
  ServerProcess s({"--model", (dir_ / "m1").string(), "--http-threads", "2", "--keep-alive-timeout", "60"});
  auto idle_client = [&] {
    const int fd = connect_loopback(s.port());
    EXPECT_GE(fd, 0);
    const std::string req = "GET /health HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\n\r\n";
    EXPECT_EQ(send(fd, req.data(), req.size(), MSG_NOSIGNAL), ssize_t(req.size()));
    // The whole answer: headers, then Content-Length bytes.
    std::string got;
    char buf[1024];
    for (;;) {
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, 10000) <= 0) break;
      const ssize_t n = recv(fd, buf, sizeof buf, 0);
      if (n <= 0) break;
      got.append(buf, size_t(n));
      const size_t end = got.find("\r\n\r\n"), cl = got.find("Content-Length: ");
      if (end != std::string::npos && cl != std::string::npos &&
          got.size() >= end + 4 + std::stoul(got.substr(cl + 16)))
        break;
    }
    EXPECT_EQ(got.rfind("HTTP/1.1 200", 0), 0u) << got;
    return fd;
  };
  const int a = idle_client(), b = idle_client();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // both idle on a worker now
  httplib::Client c("127.0.0.1", s.port());
  c.set_read_timeout(20, 0);
  auto r = c.Post("/generate", greedy_body(2).dump(), "application/json");
  ASSERT_TRUE(r) << "a request got no answer while two idle keep-alive connections held both workers";
  EXPECT_EQ(r->status, 200);
  int closed = 0;
  for (int fd : {a, b}) {
    pollfd p{fd, POLLIN, 0};
    char ch;
    if (poll(&p, 1, 2000) > 0 && recv(fd, &ch, 1, 0) == 0) ++closed;
    close(fd);
  }
  EXPECT_GE(closed, 1) << "no idle connection was closed";
}

TEST_F(ServeTest, MetricsAndModelInfo) {
  post("/generate", greedy_body(4));
  auto r = client().Get("/metrics");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  std::map<std::string, double> values;
  std::istringstream is(r->body);
  std::string line;
  while (std::getline(is, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ls(line);
    std::string name;
    double v = -1;
    ls >> name >> v;
    ASSERT_FALSE(ls.fail()) << "unparseable metric line: " << line;
    values[name] = v;
  }
  for (const char* m :
       {"lockstep_num_running_reqs", "lockstep_num_waiting_reqs", "lockstep_generation_tokens_total",
        "lockstep_gen_throughput", "lockstep_kv_usage_ratio", "lockstep_prefix_cache_hit_tokens_total"})
    EXPECT_TRUE(values.count(m)) << m;
  EXPECT_GE(values["lockstep_generation_tokens_total"], 4);
  EXPECT_GE(values["lockstep_kv_usage_ratio"], 0);
  EXPECT_LE(values["lockstep_kv_usage_ratio"], 1);

  auto info = client().Get("/get_model_info");
  ASSERT_TRUE(info);
  json j = json::parse(info->body);
  EXPECT_EQ(j["architecture"], "Qwen3MoeForCausalLM");
  EXPECT_EQ(j["vocab_size"], 300);
  EXPECT_EQ(j["max_context_length"], 256);
  EXPECT_TRUE(j["model_path"].is_string());
  EXPECT_TRUE(j["weight_version"].is_number_integer());
}

TEST_F(ServeTest, UpdateWeightsFromDiskChangesOutputs) {
  json before = post("/generate", greedy_body(24));
  const auto v0 = before["meta_info"]["weight_version"].get<uint64_t>();
  json u = post("/update_weights_from_disk", {{"model_path", (dir_ / "m2").string()}});
  EXPECT_EQ(u["success"], true);
  EXPECT_EQ(u["weight_version"], v0 + 1);
  json after = post("/generate", greedy_body(24));
  EXPECT_EQ(after["meta_info"]["weight_version"], v0 + 1);
  EXPECT_NE(ids(after), ids(before));
  auto info = json::parse(client().Get("/get_model_info")->body);
  EXPECT_EQ(info["weight_version"], v0 + 1);
  EXPECT_EQ(info["model_path"], (dir_ / "m2").string());

  // A different architecture is refused and the served weights stay.
  json bad = post("/update_weights_from_disk", {{"model_path", (dir_ / "wide").string()}}, 400);
  EXPECT_NE(bad["error"]["message"].get<std::string>().find("hidden_size"), std::string::npos) << bad.dump();
  EXPECT_EQ(ids(post("/generate", greedy_body(24))), ids(after));

  // Bad versions: negative, not a number, or the version being served.
  post("/update_weights_from_disk", {{"model_path", (dir_ / "m1").string()}, {"weight_version", -1}}, 400);
  post("/update_weights_from_disk", {{"model_path", (dir_ / "m1").string()}, {"weight_version", "v2"}}, 400);
  post("/update_weights_from_disk", {{"model_path", (dir_ / "m1").string()}, {"weight_version", v0 + 1}},
       400);
  EXPECT_EQ(ids(post("/generate", greedy_body(24))), ids(after));

  // A run's checkpoints/latest (the file naming the newest step_N), as the
  // trainer writes it: the weights of that step.
  const fs::path ckpts = dir_ / "run" / "checkpoints";
  fs::create_directories(ckpts);
  fs::copy(dir_ / "m2", ckpts / "step_3", fs::copy_options::recursive);
  std::ofstream(ckpts / "latest") << "step_3\n";
  json latest = post("/update_weights_from_disk", {{"model_path", (ckpts / "latest").string()}});
  EXPECT_EQ(latest["success"], true) << latest.dump();
  EXPECT_EQ(ids(post("/generate", greedy_body(24))), ids(after));

  // Back to the first weights (explicit version, as a string like SGLang's):
  // the first outputs return.
  json back = post("/update_weights_from_disk",
                   {{"model_path", (dir_ / "m1").string()}, {"weight_version", std::to_string(v0 + 10)}});
  EXPECT_EQ(back["weight_version"], v0 + 10);
  json again = post("/generate", greedy_body(24));
  EXPECT_EQ(ids(again), ids(before));
  EXPECT_EQ(again["meta_info"]["weight_version"], v0 + 10);
  auto flush = client().Post("/flush_cache");
  ASSERT_TRUE(flush);
  EXPECT_EQ(flush->status, 200);
}

TEST_F(ServeTest, ConcurrentBurstAndMemory) {
  // Reference answers, one at a time; warm-up for the idle RSS too.
  json greedy_ref = post("/generate", greedy_body(16));
  json seeded = {
      {"input_ids", {3, 1, 4, 1, 5, 9, 2, 6}},
      {"sampling_params", {{"temperature", 1.0}, {"top_k", 50}, {"max_new_tokens", 16}, {"seed", 77}}}};
  json seeded_ref = post("/generate", seeded);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  const int64_t idle_kib = server_->rss_kib();
  ASSERT_GT(idle_kib, 0);

  constexpr int kThreads = 16, kRequests = 200;
  std::atomic<int> next{0}, ok{0}, mismatched{0};
  std::mutex fail_mu;
  std::vector<std::string> failures;
  std::vector<std::thread> threads;
  const auto t0 = std::chrono::steady_clock::now();
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      auto c = client();
      for (int i = next++; i < kRequests; i = next++) {
        const int kind = i % 4;
        auto send = [&]() -> httplib::Result {
          if (kind == 0) return c.Post("/generate", greedy_body(16).dump(), "application/json");
          if (kind == 1) return c.Post("/generate", seeded.dump(), "application/json");
          if (kind == 2)
            return c.Post("/v1/completions",
                          json({{"prompt", "abc"}, {"max_tokens", 12}, {"temperature", 0.5}}).dump(),
                          "application/json");
          return c.Post(
              "/v1/chat/completions",
              json({{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 12}}).dump(),
              "application/json");
        };
        httplib::Result r = send();
        if (!r || r->status != 200) {
          std::lock_guard<std::mutex> l(fail_mu);
          failures.push_back(r ? std::to_string(r->status) + " " + r->body
                               : "no response: " + httplib::to_string(r.error()));
          continue;
        }
        ++ok;
        // Batch composition never changes a greedy or seeded answer.
        json j = json::parse(r->body);
        if (kind == 0 && j["output_ids"] != greedy_ref["output_ids"]) ++mismatched;
        if (kind == 1 && j["output_ids"] != seeded_ref["output_ids"]) ++mismatched;
      }
    });
  }
  for (auto& t : threads) t.join();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const int64_t peak_kib = server_->rss_kib();
  EXPECT_EQ(ok.load(), kRequests);
  for (size_t i = 0; i < failures.size() && i < 5; ++i) ADD_FAILURE() << "request failed: " << failures[i];
  EXPECT_EQ(mismatched.load(), 0);
  // Let the server go idle: it trims its heap once the burst is over (30 s at
  // most, for a loaded machine; on an idle one it takes a second or two).
  int64_t after_kib = server_->rss_kib();
  for (const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
       after_kib >= idle_kib + 64 * 1024 && std::chrono::steady_clock::now() < deadline;
       after_kib = server_->rss_kib())
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::printf(
      "[serve burst] %d requests from %d threads in %.2f s; RSS idle %.1f MiB, right after %.1f MiB, "
      "settled %.1f MiB\n",
      kRequests, kThreads, secs, double(idle_kib) / 1024, double(peak_kib) / 1024, double(after_kib) / 1024);
  EXPECT_LT(after_kib, idle_kib + 64 * 1024);
  // Nothing is left in flight.
  auto m = client().Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_NE(m->body.find("lockstep_num_http_requests_in_flight 0"), std::string::npos);
}

TEST_F(ServeTest, ClientDisconnectMidStreamLeavesServerHealthy) {
  auto c = client();
  httplib::Request req;
  req.method = "POST";
  req.path = "/generate";
  req.body = json({{"input_ids", {1, 2, 3}},
                   {"sampling_params", {{"max_new_tokens", 240}, {"ignore_eos", true}}},
                   {"stream", true}})
                 .dump();
  req.set_header("Content-Type", "application/json");
  req.set_header("Authorization", std::string("Bearer ") + kApiKey);
  int chunks = 0;
  req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++chunks < 2; };  // hang up
  c.send(req);
  EXPECT_GE(chunks, 1);
  // The server notices, aborts the request and keeps serving.
  bool idle = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!idle && std::chrono::steady_clock::now() < deadline) {
    auto m = client().Get("/metrics");
    idle = m && m->body.find("lockstep_num_http_requests_in_flight 0") != std::string::npos;
    if (!idle) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(idle);
  EXPECT_EQ(ids(post("/generate", greedy_body(4))).size(), 4u);
}

TEST_F(ServeTest, SigtermFinishesRequestsInFlight) {
  // A server of its own: it is stopped mid-request.
  ServerProcess s({"--model", (dir_ / "m1").string()});
  std::atomic<int> status{0};
  std::atomic<int64_t> tokens{-1};
  std::thread t([&] {
    httplib::Client c("127.0.0.1", s.port());
    c.set_read_timeout(60, 0);
    auto r = c.Post(
        "/generate",
        json({{"input_ids", {1, 2, 3}}, {"sampling_params", {{"max_new_tokens", 200}, {"ignore_eos", true}}}})
            .dump(),
        "application/json");
    if (r) {
      status = r->status;
      tokens = json::parse(r->body)["meta_info"]["completion_tokens"].get<int64_t>();
    }
  });
  // Stop once the request is being served (or already done); 30 s at most.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (tokens.load() < 0 && std::chrono::steady_clock::now() < deadline) {
    httplib::Client probe("127.0.0.1", s.port());
    auto m = probe.Get("/metrics");
    if (m && m->body.find("lockstep_num_http_requests_in_flight 1") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  const int code = s.terminate(30);
  t.join();
  EXPECT_EQ(code, 0);
  EXPECT_EQ(status.load(), 200);
  EXPECT_EQ(tokens.load(), 200);  // finished, not aborted
}

}  // namespace
// --- Under load: a long generation must not hold the other requests up.

// A Prometheus counter or gauge of /metrics (-1 when absent or unanswered).
double metric(int port, const std::string& name) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(10, 0);
  auto r = c.Get("/metrics");
  if (!r) return -1;
  const std::string key = "\nlockstep_" + name + " ";
  const size_t at = r->body.find(key);
  return at == std::string::npos ? -1 : std::atof(r->body.c_str() + at + key.size());
}

// Polls until pred() or `seconds`; false on timeout.
template <class Pred>
bool wait_until(Pred pred, double seconds = 60) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// n=16 samples of 2000 tokens: thousands of engine steps on the tiny model.
json long_body(int64_t n = 16) {
  return {{"input_ids", {1, 2, 3}},
          {"sampling_params", {{"max_new_tokens", 2000}, {"ignore_eos", true}, {"n", n}}}};
}

// The finish reasons of a /generate answer (one item, or a list of them).
std::vector<std::string> finish_types(const json& answer) {
  std::vector<std::string> out;
  for (const json& item : answer.is_array() ? answer : json::array({answer}))
    out.push_back(item["meta_info"]["finish_reason"]["type"].get<std::string>());
  return out;
}

// A long request in a thread of its own: its answer, once there.
class LongRequest {
 public:
  LongRequest(int port, const json& body) {
    thread_ = std::thread([this, port, body] {
      httplib::Client c("127.0.0.1", port);
      c.set_read_timeout(300, 0);
      auto r = c.Post("/generate", body.dump(), "application/json");
      std::lock_guard<std::mutex> l(mu_);
      if (r) {
        status_ = r->status;
        body_ = r->body;
      }
      done_ = true;
    });
  }
  ~LongRequest() {
    if (thread_.joinable()) thread_.join();
  }
  bool done() {
    std::lock_guard<std::mutex> l(mu_);
    return done_;
  }
  // Joins the thread; the answer's JSON (null when none came).
  json answer(int* status) {
    thread_.join();
    *status = status_;
    return json::parse(body_, nullptr, false);
  }

 private:
  std::thread thread_;
  std::mutex mu_;
  bool done_ = false;
  int status_ = 0;
  std::string body_;
};

// While a n=16, 2000-token request generates, a 4-token request joins the
// running batch (answered a few engine steps later, the long one still far
// from done), and every other endpoint answers at once. abort_all_requests
// in a weight update ends the long request with "abort", and the next
// request runs on the new weights.
TEST_F(ServeTest, ShortRequestsAndEndpointsDoNotWaitForALongGeneration) {
  ServerProcess s({"--model", (dir_ / "long").string(), "--seed", "3"});
  const int port = s.port();
  LongRequest big(port, long_body());
  ASSERT_TRUE(wait_until([&] { return metric(port, "generation_tokens_total") >= 16 * 3; }));

  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(60, 0);
  for (const char* path : {"/health", "/metrics", "/get_model_info", "/health_generate", "/v1/models"}) {
    const auto t = std::chrono::steady_clock::now();
    auto r = c.Get(path);
    ASSERT_TRUE(r) << path;
    EXPECT_EQ(r->status, 200) << path;
    EXPECT_LT(seconds_since(t), 2.0) << path << " waited for the long generation";
  }
  const auto t_flush = std::chrono::steady_clock::now();
  auto flushed = c.Post("/flush_cache");
  ASSERT_TRUE(flushed);
  EXPECT_EQ(flushed->status, 200);
  EXPECT_LT(seconds_since(t_flush), 2.0) << "/flush_cache waited for the long generation";

  const double steps_before = metric(port, "engine_steps_total");
  auto small = c.Post("/generate", greedy_body(4).dump(), "application/json");
  const double steps_after = metric(port, "engine_steps_total");
  ASSERT_TRUE(small);
  ASSERT_EQ(small->status, 200) << small->body;
  EXPECT_EQ(ids(json::parse(small->body)).size(), 4u);
  // A prefill step and three decodes, plus the steps the long request takes
  // while the HTTP requests travel: far fewer than its 2000.
  EXPECT_LE(steps_after - steps_before, 400) << "the short request waited for the long one";
  EXPECT_FALSE(big.done()) << "the long request finished before the short one";
  EXPECT_LT(metric(port, "generation_tokens_total"), 16 * 1000);

  const auto t_update = std::chrono::steady_clock::now();
  auto u = c.Post("/update_weights_from_disk",
                  json({{"model_path", (dir_ / "long2").string()}, {"abort_all_requests", true}}).dump(),
                  "application/json");
  ASSERT_TRUE(u);
  ASSERT_EQ(u->status, 200) << u->body;
  EXPECT_LT(seconds_since(t_update), 20.0);
  int status = 0;
  const json answer = big.answer(&status);
  EXPECT_EQ(status, 200);
  const std::vector<std::string> reasons = finish_types(answer);
  ASSERT_EQ(reasons.size(), 16u) << answer.dump().substr(0, 300);
  for (const std::string& r : reasons) EXPECT_EQ(r, "abort");
  const json next = json::parse(c.Post("/generate", greedy_body(2).dump(), "application/json")->body);
  EXPECT_EQ(next["meta_info"]["weight_version"], json::parse(u->body)["weight_version"]);
  EXPECT_EQ(s.terminate(20), 0);
}

// A client that disconnects (streaming or not) ends its samples: the
// engine's token counter stops moving, far short of what they asked for.
TEST_F(ServeTest, DisconnectedClientsStopGenerating) {
  ServerProcess s({"--model", (dir_ / "long").string()});
  const int port = s.port();
  auto settles = [&](const char* what) {
    ASSERT_TRUE(wait_until([&] { return metric(port, "num_http_requests_in_flight") == 0; }, 10))
        << what << ": the server did not notice the disconnect";
    ASSERT_TRUE(wait_until([&] { return metric(port, "num_running_reqs") == 0; }, 5)) << what;
    const double tokens = metric(port, "generation_tokens_total");
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    EXPECT_EQ(metric(port, "generation_tokens_total"), tokens) << what << ": tokens after the disconnect";
    EXPECT_LT(tokens, 16 * 2000) << what;
  };
  {
    // Not streaming: the client gives up after a second.
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(1, 0);
    EXPECT_FALSE(c.Post("/generate", long_body().dump(), "application/json"));
  }
  settles("non-streaming");
  const double after_first = metric(port, "generation_tokens_total");
  {
    httplib::Client c("127.0.0.1", port);
    httplib::Request req;
    req.method = "POST";
    req.path = "/generate";
    json body = long_body();
    body["stream"] = true;
    req.body = body.dump();
    req.set_header("Content-Type", "application/json");
    int chunks = 0;
    req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++chunks < 20; };  // hang up
    c.send(req);
    EXPECT_GE(chunks, 1);
  }
  settles("streaming");
  EXPECT_LT(metric(port, "generation_tokens_total") - after_first, 16 * 2000);
  EXPECT_GE(metric(port, "samples_aborted_total"), 32);
  EXPECT_EQ(s.terminate(20), 0);
}

// /abort_request ends one request by its rid (the other runs on), then
// abort_all ends the rest; both answer with finish reason abort.
TEST_F(ServeTest, AbortRequestEndsRequestsByRidOrAll) {
  ServerProcess s({"--model", (dir_ / "long").string()});
  const int port = s.port();
  json keep_body = long_body(2), drop_body = long_body(2);
  keep_body["rid"] = "keep-1";
  drop_body["rid"] = "drop-1";
  LongRequest keep(port, keep_body), drop(port, drop_body);
  ASSERT_TRUE(wait_until([&] { return metric(port, "num_running_reqs") >= 4; }));
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(30, 0);
  auto abort = [&](const json& body, int expect) {
    auto r = c.Post("/abort_request", body.dump(), "application/json");
    EXPECT_TRUE(r);
    if (!r) return json();
    EXPECT_EQ(r->status, expect) << r->body;
    return json::parse(r->body, nullptr, false);
  };
  EXPECT_EQ(abort({{"rid", "drop-1"}}, 200)["aborted"], 1);
  int status = 0;
  const json dropped = drop.answer(&status);
  EXPECT_EQ(status, 200);
  for (const std::string& r : finish_types(dropped)) EXPECT_EQ(r, "abort");
  EXPECT_FALSE(keep.done()) << "aborting one request ended the other";
  EXPECT_EQ(abort({{"rid", "no-such-request"}}, 200)["aborted"], 0);
  abort({{"rid", 5}}, 400);
  abort({{"request", "keep-1"}}, 400);
  abort(json::object(), 400);
  EXPECT_EQ(abort({{"abort_all", true}}, 200)["aborted"], 1);
  const json kept = keep.answer(&status);
  EXPECT_EQ(status, 200);
  for (const std::string& r : finish_types(kept)) EXPECT_EQ(r, "abort");
  EXPECT_EQ(kept[0]["meta_info"]["id"], "keep-1-0");
  EXPECT_EQ(s.terminate(20), 0);
}

// SIGTERM lets the long request run on (--shutdown-timeout 30); a second
// SIGTERM aborts it, and the process exits well within 2 s of it, after
// answering the request with finish reason abort.
TEST_F(ServeTest, SecondSigtermAbortsAndExitsAtOnce) {
  ServerProcess s({"--model", (dir_ / "long").string(), "--shutdown-timeout", "30"});
  LongRequest big(s.port(), long_body());
  ASSERT_TRUE(wait_until([&] { return metric(s.port(), "generation_tokens_total") >= 16 * 3; }));
  kill(s.pid(), SIGTERM);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_FALSE(big.done()) << "the first SIGTERM did not let the request run on";
  const auto t = std::chrono::steady_clock::now();
  const int code = s.terminate(2.0);  // the second SIGTERM
  EXPECT_EQ(code, 0) << "not exited " << seconds_since(t) << " s after the second SIGTERM";
  int status = 0;
  const json answer = big.answer(&status);
  EXPECT_EQ(status, 200);
  for (const std::string& r : finish_types(answer)) EXPECT_EQ(r, "abort");
}

// With --shutdown-timeout 1, one SIGTERM lets the long request run for a
// second, then aborts it; the process exits soon after.
TEST_F(ServeTest, ShutdownTimeoutAbortsTheRequestsStillRunning) {
  ServerProcess s({"--model", (dir_ / "long").string(), "--shutdown-timeout", "1"});
  LongRequest big(s.port(), long_body());
  ASSERT_TRUE(wait_until([&] { return metric(s.port(), "generation_tokens_total") >= 16 * 3; }));
  const auto t = std::chrono::steady_clock::now();
  const int code = s.terminate(3.0);
  EXPECT_EQ(code, 0) << "not exited " << seconds_since(t) << " s after SIGTERM";
  EXPECT_GE(seconds_since(t), 0.9) << "the request did not get its shutdown timeout";
  int status = 0;
  const json answer = big.answer(&status);
  EXPECT_EQ(status, 200);
  for (const std::string& r : finish_types(answer)) EXPECT_EQ(r, "abort");
}

// 200 clients that send half a request and stop hold every worker; while
// others wait, each gives its worker up within a fraction of a second, so a
// valid request is answered in under 2 s (the header timeout is 3 s, and the
// plain request timeout 30 s). Alone, a half-sent request gets its 408 at the
// header timeout.
TEST_F(ServeTest, HalfSentRequestsDoNotStarveTheServer) {
  ServerProcess s({"--model", (dir_ / "m1").string(), "--header-timeout", "3"});
  std::vector<int> fds;
  const std::string half = "POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n";
  for (int i = 0; i < 200; ++i) {
    const int fd = connect_loopback(s.port());
    ASSERT_GE(fd, 0);
    ASSERT_EQ(send(fd, half.data(), half.size(), MSG_NOSIGNAL), ssize_t(half.size()));
    fds.push_back(fd);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  httplib::Client c("127.0.0.1", s.port());
  c.set_read_timeout(30, 0);
  const auto t = std::chrono::steady_clock::now();
  auto r = c.Post("/generate", greedy_body(2).dump(), "application/json");
  const double took = seconds_since(t);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_LT(took, 2.0) << "a valid request waited behind 200 half-sent ones";
  for (int fd : fds) close(fd);

  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the workers are free again
  const int fd = connect_loopback(s.port());
  ASSERT_GE(fd, 0);
  const auto t_alone = std::chrono::steady_clock::now();
  ASSERT_EQ(send(fd, half.data(), half.size(), MSG_NOSIGNAL), ssize_t(half.size()));
  std::string got;
  char buf[1024];
  pollfd p{fd, POLLIN, 0};
  while (poll(&p, 1, 10000) > 0) {
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    got.append(buf, size_t(n));
  }
  const double alone = seconds_since(t_alone);
  close(fd);
  EXPECT_EQ(got.rfind("HTTP/1.1 408", 0), 0u) << got;
  EXPECT_NE(got.find("--header-timeout"), std::string::npos) << got;
  EXPECT_GT(alone, 2.5);
  EXPECT_LT(alone, 8.0);
}
