// Tests for PythonReward and its pool on real Python processes: verl-style
// files written here (a plain float, a dict with extra keys, async def,
// exceptions on some inputs, a sleep past the limit, os._exit and a
// segfault, print() to stdout), start-up errors naming file:line, results
// in order over two workers, and no zombie left behind.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "lockstep/base/error.h"
#include "lockstep/reward/batch.h"
#include "lockstep/reward/python_reward.h"

namespace lockstep::reward {
namespace {

namespace fs = std::filesystem;

class PythonRewardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ls_pyreward_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& text) {
    std::string p = dir_ + "/" + name;
    std::ofstream(p) << text;
    return p;
  }
  RewardOptions options(const std::string& path, int workers = 1, double timeout_s = 10) {
    RewardOptions o;
    o.type = "python";
    o.path = path;
    o.workers = workers;
    o.timeout_s = timeout_s;
    // Debian's interpreter when there is one: it starts in a tenth of the
    // time of a version manager's shim, and the tests start many workers.
    if (access("/usr/bin/python3", X_OK) == 0) o.python = "/usr/bin/python3";
    return o;
  }
  static RewardRequest req(const std::string& response, nlohmann::json label, nlohmann::json metadata = nullptr) {
    return RewardRequest{"", response, std::move(label), std::move(metadata)};
  }
  // The Error message of constructing the reward ("" if none was thrown).
  std::string start_error(const RewardOptions& o) {
    try {
      PythonReward r(o);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
  static bool gone(pid_t pid) { return kill(pid, 0) != 0 && errno == ESRCH; }

  std::string dir_;
};

TEST_F(PythonRewardTest, PlainFloatPerRequest) {
  auto path = write("plain.py",
                    "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                    "    return float(solution_str) * 10 + float(ground_truth)\n");
  PythonReward r(options(path));
  EXPECT_EQ(r.type(), "python");
  // Different answers per sample: each result must belong to its request.
  for (int i = 0; i < 5; ++i) {
    auto res = r.evaluate(req(std::to_string(i), std::to_string(7 - i)));
    ASSERT_FALSE(res.failed()) << res.failure;
    EXPECT_DOUBLE_EQ(res.reward, i * 10 + (7 - i));
    EXPECT_TRUE(res.correct);
  }
  auto zero = r.evaluate(req("0", "0"));
  EXPECT_EQ(zero.reward, 0.0);
  EXPECT_FALSE(zero.correct);
}

TEST_F(PythonRewardTest, KeywordArgumentsFollowVerl) {
  auto path = write("kw.py",
                    "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                    "    ok = solution_str == ground_truth\n"
                    "    return {'score': float(ok), 'ds_gsm8k': data_source == 'gsm8k',\n"
                    "            'ei_k': (extra_info or {}).get('k', -1), 'ei_none': extra_info is None}\n");
  PythonReward r(options(path));
  auto a = r.evaluate(req("4", "4", {{"data_source", "gsm8k"}, {"k", 3}}));
  ASSERT_FALSE(a.failed()) << a.failure;
  EXPECT_EQ(a.reward, 1.0);
  EXPECT_EQ(a.extra.at("ds_gsm8k"), 1.0);
  EXPECT_EQ(a.extra.at("ei_k"), 3.0);  // no "extra_info" key: the metadata itself
  auto b = r.evaluate(req("4", "5", {{"data_source", "math"}, {"extra_info", {{"k", 9}}}}));
  EXPECT_EQ(b.reward, 0.0);
  EXPECT_EQ(b.extra.at("ds_gsm8k"), 0.0);
  EXPECT_EQ(b.extra.at("ei_k"), 9.0);  // metadata["extra_info"]
  auto c = r.evaluate(req("4", "4"));
  EXPECT_EQ(c.extra.at("ei_none"), 1.0);  // no metadata: None

  auto kw = verl_kwargs(req("x", 5, {{"data_source", "d"}}));
  EXPECT_EQ(kw["data_source"], "d");
  EXPECT_EQ(kw["solution_str"], "x");
  EXPECT_EQ(kw["ground_truth"], 5);
  EXPECT_EQ(kw["extra_info"], nlohmann::json({{"data_source", "d"}}));
}

TEST_F(PythonRewardTest, DictWithExtraKeysBecomesMetrics) {
  auto path = write("dict.py",
                    "def compute_score(data_source, solution_str, ground_truth, extra_info=None) -> dict:\n"
                    "    acc = solution_str.strip() == ground_truth\n"
                    "    return {'score': 1.0 if acc else -0.5, 'acc': acc, 'length': len(solution_str),\n"
                    "            'pred': solution_str.strip(), 'note': 'text is ignored'}\n");
  auto reward = std::make_shared<PythonReward>(options(path));
  auto wrong = reward->evaluate(req("12", "7"));
  ASSERT_FALSE(wrong.failed()) << wrong.failure;
  EXPECT_EQ(wrong.reward, -0.5);
  EXPECT_FALSE(wrong.correct);
  EXPECT_EQ(wrong.extracted, "12");
  EXPECT_EQ(wrong.extra.at("length"), 2.0);
  EXPECT_EQ(wrong.extra.count("note"), 0u);
  EXPECT_EQ(wrong.extra.count("score"), 0u);

  BatchScorer scorer(reward, batch_options_for(options(path)));
  BatchStats stats;
  auto res = scorer.score({req("7", "7"), req("123", "7"), req(" 7", "7")}, &stats);
  ASSERT_EQ(res.size(), 3u);
  EXPECT_TRUE(res[0].correct);
  EXPECT_FALSE(res[1].correct);
  EXPECT_TRUE(res[2].correct);
  auto m = stats.metrics();
  EXPECT_DOUBLE_EQ(m.at("reward/extra/length"), 2.0);  // (1 + 3 + 2) / 3
  EXPECT_DOUBLE_EQ(m.at("reward/extra/acc"), 2.0 / 3.0);
  EXPECT_DOUBLE_EQ(m.at("rollout/reward_mean"), 1.5 / 3.0);
}

TEST_F(PythonRewardTest, AsyncFunctionIsAwaited) {
  auto path = write("async_r.py",
                    "import asyncio\n"
                    "async def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                    "    await asyncio.sleep(0.001)\n"
                    "    return len(solution_str) + 0.5\n");
  PythonReward r(options(path));
  EXPECT_TRUE(r.pool().function("compute_score").is_async);
  for (int i = 1; i < 4; ++i) {
    auto res = r.evaluate(req(std::string(size_t(i), 'x'), "_"));
    ASSERT_FALSE(res.failed()) << res.failure;
    EXPECT_EQ(res.reward, i + 0.5);
  }
}

TEST_F(PythonRewardTest, ExceptionIsAFailureNotAZero) {
  auto path = write("raises.py",
                    "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                    "    n = int(solution_str)\n"
                    "    if n % 2:\n"
                    "        raise ValueError(f'odd answer {n}')\n"
                    "    return n\n");
  PythonReward r(options(path));
  auto odd = r.evaluate(req("3", "_"));
  EXPECT_TRUE(odd.failed());
  EXPECT_TRUE(std::isnan(odd.reward));
  EXPECT_EQ(odd.failure, "python: ValueError: odd answer 3");
  auto bad = r.evaluate(req("x", "_"));
  EXPECT_EQ(bad.failure.rfind("python: ValueError: invalid literal", 0), 0u) << bad.failure;
  auto even = r.evaluate(req("4", "_"));
  ASSERT_FALSE(even.failed()) << even.failure;
  EXPECT_EQ(even.reward, 4.0);
  EXPECT_EQ(r.pool().restarts(), 0);  // an exception does not cost the worker
}

TEST_F(PythonRewardTest, NonNumericReturnNamesFileAndLine) {
  auto path = write("strret.py",
                    "import math\n"
                    "\n"
                    "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                    "    if solution_str == 'nan':\n"
                    "        return math.nan\n"
                    "    if solution_str == 'nodict':\n"
                    "        return {'acc': 1}\n"
                    "    if solution_str == 'obj':\n"
                    "        return object()\n"
                    "    return 'yes'\n");
  PythonReward r(options(path));
  EXPECT_EQ(r.evaluate(req("a", "_")).failure,
            "bad_return: compute_score (strret.py:3) returned str, expected a number or a dict with 'score'");
  EXPECT_NE(r.evaluate(req("nan", "_")).failure.find("returned nan"), std::string::npos);
  EXPECT_NE(r.evaluate(req("nodict", "_")).failure.find("a dict without 'score'"), std::string::npos);
  EXPECT_NE(r.evaluate(req("obj", "_")).failure.find("returned object"), std::string::npos);
}

TEST_F(PythonRewardTest, SampleSleepingPastTheLimitKillsAndRestartsItsWorker) {
  auto path = write("slow.py",
                    "import time\n"
                    "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                    "    if solution_str == 'slow':\n"
                    "        time.sleep(60)\n"
                    "    return 1.0\n");
  PythonReward r(options(path, 1, 0.5));
  const pid_t first = r.pool().pids().at(0);
  auto t0 = std::chrono::steady_clock::now();
  auto slow = r.evaluate(req("slow", "_"));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));  // nothing hangs
  EXPECT_EQ(slow.failure.rfind("timeout: compute_score (slow.py:2) ran past 0.5 s", 0), 0u) << slow.failure;
  // The next sample waits for the restarted worker (timeout_s bounds that wait).
  RewardResult next;
  for (int i = 0; i < 40 && (next = r.evaluate(req("fast", "_"))).failed(); ++i) {
  }
  ASSERT_FALSE(next.failed()) << next.failure;
  EXPECT_EQ(r.pool().restarts(), 1);
  EXPECT_TRUE(gone(first)) << "the killed worker " << first << " was not reaped";
  EXPECT_NE(r.pool().pids().at(0), first);
}

TEST_F(PythonRewardTest, CrashingWorkerIsRestarted) {
  auto path = write("crash.py",
                    "import ctypes, os\n"
                    "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                    "    if solution_str == 'exit':\n"
                    "        os._exit(3)\n"
                    "    if solution_str == 'segv':\n"
                    "        ctypes.string_at(0)\n"
                    "    return 2.0\n");
  PythonReward r(options(path, 1, 5));
  auto exited = r.evaluate(req("exit", "_"));
  EXPECT_EQ(exited.failure.rfind("crashed:", 0), 0u) << exited.failure;
  EXPECT_NE(exited.failure.find("exit code 3"), std::string::npos) << exited.failure;
  auto ok = r.evaluate(req("fine", "_"));
  ASSERT_FALSE(ok.failed()) << ok.failure;
  EXPECT_EQ(ok.reward, 2.0);
  auto segv = r.evaluate(req("segv", "_"));
  EXPECT_NE(segv.failure.find("SIGSEGV"), std::string::npos) << segv.failure;
  auto again = r.evaluate(req("fine", "_"));
  ASSERT_FALSE(again.failed()) << again.failure;
  EXPECT_EQ(r.pool().restarts(), 2);
}

TEST_F(PythonRewardTest, PrintToStdoutDoesNotBreakTheProtocol) {
  auto path = write("noisy.py",
                    "import sys\n"
                    "print('importing', flush=True)\n"
                    "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                    "    print('{\"id\": 1, \"result\": 99}')\n"
                    "    print('x' * 100000)\n"
                    "    sys.stdout.write('no newline')\n"
                    "    return float(solution_str)\n");
  PythonReward r(options(path));
  for (int i = 0; i < 3; ++i) {
    auto res = r.evaluate(req(std::to_string(i), "_"));
    ASSERT_FALSE(res.failed()) << res.failure;
    EXPECT_EQ(res.reward, double(i));
  }
}

TEST_F(PythonRewardTest, StartUpErrorsNameTheFileAndLine) {
  const std::string sig = "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n";
  auto syntax = write("syntax.py", "import os\n\n" + sig + "    return (1 +\n");
  std::string e = start_error(options(syntax));
  EXPECT_NE(e.find("syntax.py:4"), std::string::npos) << e;
  EXPECT_NE(e.find("SyntaxError"), std::string::npos) << e;

  auto missing = write("other.py", "def score(a, b):\n    return 1\n");
  e = start_error(options(missing));
  EXPECT_NE(e.find("other.py: no function 'compute_score' (functions defined there: score)"), std::string::npos) << e;

  auto notcallable = write("notcall.py", "compute_score = 3\n");
  e = start_error(options(notcallable));
  EXPECT_NE(e.find("'compute_score' is a int, not a function"), std::string::npos) << e;

  auto importerr = write("imperr.py", "x = 1\nraise RuntimeError('no model here')\n" + sig + "    return 1\n");
  e = start_error(options(importerr));
  EXPECT_NE(e.find("imperr.py:2: RuntimeError: no model here"), std::string::npos) << e;

  auto annotated = write("annot.py", "\n" + sig.substr(0, sig.size() - 2) + " -> str:\n    return 'x'\n");
  e = start_error(options(annotated));
  EXPECT_NE(e.find("annot.py:2: compute_score is annotated to return other"), std::string::npos) << e;

  e = start_error(options(dir_ + "/nope.py"));
  EXPECT_NE(e.find("nope.py: no such file"), std::string::npos) << e;

  auto fine = write("fine.py", sig + "    return 1\n");
  RewardOptions o = options(fine);
  o.python = "python3-not-installed-here";
  e = start_error(o);
  EXPECT_NE(e.find("python interpreter 'python3-not-installed-here' not found"), std::string::npos) << e;

  o = options(fine);
  o.python = dir_;  // a directory is not a program
  e = start_error(o);
  EXPECT_NE(e.find("not found"), std::string::npos) << e;

  o = options(fine);
  o.function = "other_name";
  e = start_error(o);
  EXPECT_NE(e.find("no function 'other_name' (functions defined there: compute_score)"), std::string::npos) << e;
}

TEST_F(PythonRewardTest, TwoWorkersKeepResultsInOrder) {
  auto path = write("par.py",
                    "import os, time\n"
                    "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                    "    time.sleep(0.001)\n"
                    "    return {'score': int(solution_str) * 3 + int(ground_truth), 'pid': os.getpid()}\n");
  auto reward = std::make_shared<PythonReward>(options(path, 2));
  EXPECT_EQ(reward->max_parallelism(), 2);
  BatchScorer scorer(reward, batch_options_for(options(path, 2)));
  EXPECT_EQ(scorer.threads(), 2);
  std::vector<RewardRequest> reqs;
  for (int i = 0; i < 300; ++i) reqs.push_back(req(std::to_string(i), std::to_string(i % 3)));
  auto res = scorer.score(reqs);
  ASSERT_EQ(res.size(), reqs.size());
  std::set<double> pids;
  for (int i = 0; i < 300; ++i) {
    ASSERT_FALSE(res[size_t(i)].failed()) << res[size_t(i)].failure;
    EXPECT_EQ(res[size_t(i)].reward, i * 3 + i % 3) << "sample " << i;
    pids.insert(res[size_t(i)].extra.at("pid"));
  }
  auto live = reward->pool().pids();
  EXPECT_EQ(live.size(), 2u);
  for (double p : pids) EXPECT_TRUE(std::count(live.begin(), live.end(), pid_t(p)) == 1) << p;
}

TEST_F(PythonRewardTest, DestructorReapsEveryWorker) {
  auto path = write("busy.py",
                    "import signal, time\n"
                    "signal.signal(signal.SIGTERM, signal.SIG_IGN)  # only SIGKILL ends it\n"
                    "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                    "    time.sleep(60)\n");
  std::vector<pid_t> pids;
  {
    PythonReward r(options(path, 3, 0.3));
    pids = r.pool().pids();
    ASSERT_EQ(pids.size(), 3u);
    EXPECT_EQ(r.evaluate(req("a", "_")).failure.rfind("timeout", 0), 0u);  // one worker is being restarted
  }
  for (pid_t p : pids) EXPECT_TRUE(gone(p)) << "worker " << p << " left behind";
  EXPECT_EQ(waitpid(-1, nullptr, WNOHANG), -1);  // no child of ours at all, zombie or not
  EXPECT_EQ(errno, ECHILD);
}

TEST_F(PythonRewardTest, OptionsParseAndValidate) {
  auto o = RewardOptions::from_json(
      {{"type", "python"}, {"path", "r.py"}, {"function", "score"}, {"workers", 2}, {"python", "/usr/bin/python3"}});
  EXPECT_EQ(o.path, "r.py");
  EXPECT_EQ(o.function, "score");
  EXPECT_EQ(o.workers, 2);
  EXPECT_EQ(o.python, "/usr/bin/python3");
  EXPECT_THROW(RewardOptions::from_json({{"type", "python"}}), Error);  // no path
  EXPECT_THROW(RewardOptions::from_json({{"type", "python"}, {"path", "r.py"}, {"workers", -1}}), Error);
  EXPECT_EQ(batch_options_for(o).timeout_s, o.timeout_s + 0.5);
  o.workers = 6;  // one scoring thread per worker, whatever the core count
  EXPECT_EQ(batch_options_for(o).threads, 6);
  o.threads = 3;
  EXPECT_EQ(batch_options_for(o).threads, 3);
}

}  // namespace
}  // namespace lockstep::reward
