// Tests for base/: checks and errors, Philox known answers, the static
// parallel-for partition.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "lockstep/base/error.h"
#include "lockstep/base/log.h"
#include "lockstep/base/rng.h"
#include "lockstep/base/thread_pool.h"

namespace lockstep {

// The message of the Error `f` throws; a test failure if it throws none.
template <typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no Error thrown";
  return "";
}

TEST(Check, PassingCheckDoesNothing) {
  int evaluated = 0, hinted = 0;
  auto hint = [&] { return ++hinted; };
  EXPECT_NO_THROW({ LS_CHECK(++evaluated == 1) << "never built " << hint(); });
  EXPECT_EQ(evaluated, 1);  // the condition once
  EXPECT_EQ(hinted, 0);     // the message not at all
}

TEST(Check, FailingCheckThrowsWithMessage) {
  bool reached = false;
  int evaluated = 0;
  const std::string msg = error_of([&] {
    int n = 3;
    LS_CHECK(++evaluated && n == 4) << "n=" << n;
    reached = true;
  });
  EXPECT_FALSE(reached) << "the statement after a failing check ran";
  EXPECT_EQ(evaluated, 1);
  EXPECT_NE(msg.find("check failed: ++evaluated && n == 4: n=3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("base_test.cpp:"), std::string::npos) << msg;
  // Without a hint: the condition alone, no trailing separator.
  const std::string bare = error_of([] { LS_CHECK(1 > 2); });
  EXPECT_EQ(bare.substr(bare.find("check failed")), "check failed: 1 > 2");
  EXPECT_THROW(LS_CHECK(false) << "x", Error);
}

TEST(Check, CheckIsOneStatementInsideIfElse) {
  // The macro's own if/else must not capture a following `else`.
  int taken = 0;
  for (bool outer : {true, false}) {
    if (outer)
      LS_CHECK(true) << "fine";
    else
      ++taken;
  }
  EXPECT_EQ(taken, 1);
  bool reached = false;
  EXPECT_THROW(
      {
        if (taken == 1)
          LS_CHECK(taken == 0) << "taken=" << taken;
        else
          reached = true;
        reached = true;
      },
      Error);
  EXPECT_FALSE(reached);
}

TEST(Check, ThrowMacroCarriesText) {
  bool reached = false;
  EXPECT_EQ(error_of([&] {
              LS_THROW << "data.jsonl:" << 7 << ": missing field 'prompt'";
              reached = true;
            }),
            "data.jsonl:7: missing field 'prompt'");
  EXPECT_FALSE(reached) << "the statement after LS_THROW ran";
  EXPECT_THROW(LS_THROW << "", Error);
}

TEST(Log, ParsesLevels) {
  EXPECT_EQ(parse_log_level("debug"), LogLevel::Debug);
  EXPECT_EQ(parse_log_level("warn"), LogLevel::Warn);
  EXPECT_THROW(parse_log_level("loud"), Error);
}

// Known-answer vectors from the Random123 distribution (kat_vectors).
TEST(Philox, KnownAnswers) {
  auto a = philox4x32({0, 0, 0, 0}, {0, 0});
  EXPECT_EQ(a, (std::array<uint32_t, 4>{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  auto b = philox4x32({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu});
  EXPECT_EQ(b, (std::array<uint32_t, 4>{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
  auto c = philox4x32({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u});
  EXPECT_EQ(c, (std::array<uint32_t, 4>{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
}

TEST(Philox, StatelessAndKeyed) {
  Philox r(42), s(43);
  EXPECT_EQ(r.u64(1, 2), Philox(42).u64(1, 2));
  EXPECT_NE(r.u64(1, 2), r.u64(1, 3));
  EXPECT_NE(r.u64(1, 2), r.u64(2, 2));
  EXPECT_NE(r.u64(1, 2), s.u64(1, 2));
  double mean = 0;
  for (int i = 0; i < 10000; ++i) {
    float u = r.uniform(7, i);
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    mean += u;
  }
  EXPECT_NEAR(mean / 10000, 0.5, 0.02);
}

TEST(ThreadPool, StaticPartitionCoversRangeOnce) {
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 2, 5, 17, 1000}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      pool.parallel_for(n, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)]++;
      });
      for (auto& h : hits) ASSERT_EQ(h.load(), 1);
    }
  }
}

TEST(ThreadPool, PartitionDependsOnlyOnSizeAndThreads) {
  ThreadPool pool(2);
  std::vector<std::pair<int64_t, int64_t>> first, second;
  std::mutex mu;
  for (auto* out : {&first, &second}) {
    pool.parallel_for(101, [&](int64_t b, int64_t e) {
      std::lock_guard<std::mutex> l(mu);
      out->emplace_back(b, e);
    });
    std::sort(out->begin(), out->end());
  }
  EXPECT_EQ(first, second);
  EXPECT_EQ(first, (std::vector<std::pair<int64_t, int64_t>>{{0, 50}, {50, 101}}));
}

TEST(ThreadPool, RethrowsWorkerException) {
  ThreadPool pool(2);
  EXPECT_THROW(pool.parallel_for(10, [&](int64_t b, int64_t) {
    if (b > 0) LS_THROW << "boom";
  }),
               Error);
  // The pool still works afterwards.
  std::atomic<int64_t> sum{0};
  pool.parallel_for(10, [&](int64_t b, int64_t e) { sum += e - b; });
  EXPECT_EQ(sum.load(), 10);
}

// Workers poll for jobs before they sleep (LOCKSTEP_SPIN_US): with polling
// off, short, and longer than the gaps between jobs, thousands of back-to-back
// jobs of 2..4 tasks (so some workers sit a job out), from two callers sharing
// the pool, each run every task exactly once; an exception still reaches its
// caller; pools made and destroyed while their workers poll shut down.
TEST(ThreadPool, PollingWorkersRunEachTaskOnce) {
  for (const char* spin : {"0", "5", "2000"}) {
    SCOPED_TRACE(std::string("LOCKSTEP_SPIN_US=") + spin);
    ::setenv("LOCKSTEP_SPIN_US", spin, 1);
    ThreadPool pool(4);
    auto caller = [&](int seed, int64_t* bad) {
      for (int j = 0; j < 3000; ++j) {
        const int tasks = 2 + (j + seed) % 3;
        std::vector<std::atomic<int>> ran(static_cast<size_t>(tasks));
        for (auto& r : ran) r = 0;
        pool.run_on_workers(tasks, [&](int t) { ran[size_t(t)]++; });
        for (auto& r : ran) *bad += r.load() != 1;
      }
    };
    int64_t bad_a = 0, bad_b = 0;
    std::thread other([&] { caller(1, &bad_b); });
    caller(0, &bad_a);
    other.join();
    EXPECT_EQ(bad_a + bad_b, 0) << "tasks that did not run exactly once";
    EXPECT_THROW(pool.run_on_workers(3,
                                     [](int t) {
                                       if (t == 2) LS_THROW << "boom";
                                     }),
                 Error);
    for (int i = 0; i < 50; ++i) {
      ThreadPool p(3);
      std::atomic<int64_t> sum{0};
      p.parallel_for(9, [&](int64_t b, int64_t e) { sum += e - b; });
      EXPECT_EQ(sum.load(), 9);
    }
  }
  ::unsetenv("LOCKSTEP_SPIN_US");
}

}  // namespace lockstep
