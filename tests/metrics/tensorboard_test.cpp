// TensorBoard event files: CRC32C on published test vectors, the TFRecord
// framing and the protobuf wire bytes against hand-written expectations, and
// the events file read back with a small independent decoder (tests/cli/
// tensorboard_events.sh reads it with protoc-generated Python as well).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "lockstep/metrics/crc32c.h"
#include "lockstep/metrics/metrics_logger.h"
#include "lockstep/metrics/proto_wire.h"
#include "lockstep/metrics/tensorboard_writer.h"
#include "lockstep/metrics/tfrecord.h"

namespace lockstep::metrics {
namespace {

namespace fs = std::filesystem;

std::string temp_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("lockstep_tb_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

uint64_t le(const std::string& s, size_t at, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | uint8_t(s[at + size_t(i)]);
  return v;
}

// The unmasking TensorFlow's readers apply: (masked - delta) rotated left 15.
uint32_t unmask(uint32_t m) {
  const uint32_t r = m - 0xA282EAD8u;
  return (r >> 17) | (r << 15);
}

// The payloads of a TFRecord byte string; every CRC is checked.
std::vector<std::string> records(const std::string& data) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at < data.size()) {
    EXPECT_GE(data.size() - at, 16u) << "a torn record at byte " << at;
    if (data.size() - at < 16) break;
    const uint64_t n = le(data, at, 8);
    EXPECT_EQ(unmask(uint32_t(le(data, at + 8, 4))), crc32c(data.substr(at, 8))) << "length CRC at " << at;
    const std::string payload = data.substr(at + 12, n);
    EXPECT_EQ(unmask(uint32_t(le(data, at + 12 + n, 4))), crc32c(payload)) << "payload CRC at " << at;
    out.push_back(payload);
    at += 16 + n;
  }
  return out;
}

// A decoded protobuf field: a varint, fixed bits, or bytes.
struct Field {
  int wire = 0;
  uint64_t num = 0;
  std::string bytes;
};

uint64_t read_varint(const std::string& s, size_t& at) {
  uint64_t v = 0;
  for (int shift = 0; at < s.size(); shift += 7) {
    const uint8_t b = uint8_t(s[at++]);
    v |= uint64_t(b & 0x7Fu) << shift;
    if (!(b & 0x80u)) break;
  }
  return v;
}

std::multimap<int, Field> fields(const std::string& msg) {
  std::multimap<int, Field> out;
  size_t at = 0;
  while (at < msg.size()) {
    const uint64_t key = read_varint(msg, at);
    Field f;
    f.wire = int(key & 7u);
    if (f.wire == 0) {
      f.num = read_varint(msg, at);
    } else if (f.wire == 1 || f.wire == 5) {
      const int n = f.wire == 1 ? 8 : 4;
      f.num = le(msg, at, n);
      at += size_t(n);
    } else {
      EXPECT_EQ(f.wire, 2);
      const uint64_t n = read_varint(msg, at);
      f.bytes = msg.substr(at, n);
      at += n;
    }
    out.emplace(int(key >> 3), f);
  }
  return out;
}

double as_double(uint64_t bits) {
  double d = 0;
  std::memcpy(&d, &bits, 8);
  return d;
}

float as_float(uint64_t bits) {
  const auto b = uint32_t(bits);
  float f = 0;
  std::memcpy(&f, &b, 4);
  return f;
}

// An Event's step and scalars (tag -> value).
struct Scalars {
  int64_t step = 0;
  double wall_time = 0;
  std::map<std::string, float> values;
};

Scalars scalars_of(const std::string& event) {
  Scalars s;
  const auto e = fields(event);
  s.wall_time = as_double(e.find(1)->second.num);
  if (e.count(2)) s.step = int64_t(e.find(2)->second.num);
  EXPECT_EQ(e.count(5), 1u) << "no summary";
  if (!e.count(5)) return s;
  const auto summary = fields(e.find(5)->second.bytes);
  for (auto [it, end] = summary.equal_range(1); it != end; ++it) {
    const auto v = fields(it->second.bytes);
    s.values[v.find(1)->second.bytes] = as_float(v.find(2)->second.num);
  }
  return s;
}

std::vector<std::string> event_files(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::string hex(const std::string& s) {
  std::string out;
  char buf[4];
  for (char c : s) {
    std::snprintf(buf, sizeof buf, "%02x", unsigned(uint8_t(c)));
    out += buf;
  }
  return out;
}

TEST(Crc32c, KnownVectors) {
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(crc32c(""), 0u);
  // RFC 3720 (iSCSI), appendix B.4: 32 bytes of zeros, of ones, ascending.
  EXPECT_EQ(crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(crc32c(std::string(32, '\xFF')), 0x62A8AB43u);
  std::string up;
  for (int i = 0; i < 32; ++i) up.push_back(char(i));
  EXPECT_EQ(crc32c(up), 0x46DD794Eu);
}

TEST(Crc32c, MaskRotatesAndAdds) {
  const uint32_t c = crc32c("123456789");
  EXPECT_EQ(masked_crc32c("123456789"), ((c >> 15) | (c << 17)) + 0xA282EAD8u);
  EXPECT_NE(masked_crc32c("123456789"), c);
  EXPECT_EQ(unmask(masked_crc32c("foo")), crc32c("foo"));
}

TEST(TfRecord, FramesLengthPayloadAndMaskedCrcs) {
  const std::string rec = tfrecord_frame("abc");
  ASSERT_EQ(rec.size(), 8u + 4u + 3u + 4u);
  EXPECT_EQ(rec.substr(0, 8), std::string("\x03\0\0\0\0\0\0\0", 8));
  EXPECT_EQ(le(rec, 8, 4), masked_crc32c(rec.substr(0, 8)));
  EXPECT_EQ(rec.substr(12, 3), "abc");
  EXPECT_EQ(le(rec, 15, 4), masked_crc32c("abc"));
  // Two records back to back read back as two payloads, one of them empty.
  EXPECT_EQ(records(rec + tfrecord_frame("")), (std::vector<std::string>{"abc", ""}));
}

// The byte strings of the protocol-buffer encoding guide, and fixed widths.
TEST(ProtoWire, EncodesLikeProtobuf) {
  ProtoWriter a;
  a.field_varint(1, 150);
  EXPECT_EQ(hex(a.bytes()), "089601");
  ProtoWriter b;
  b.field_bytes(2, "testing");
  EXPECT_EQ(hex(b.bytes()), "120774657374696e67");
  ProtoWriter c;
  c.field_double(1, 1.0);
  c.field_float(2, 1.0f);
  EXPECT_EQ(hex(c.bytes()), "09000000000000f03f150000803f");
  ProtoWriter d;
  d.field_varint(2, uint64_t(int64_t(-1)));  // int64 -1: ten bytes
  EXPECT_EQ(hex(d.bytes()), "10ffffffffffffffffff01");
}

TEST(TensorBoardWriter, WritesVersionThenOneEventPerStep) {
  const std::string dir = temp_dir("writer");
  std::string path;
  {
    TensorBoardWriter w(dir + "/tb", 1700000000.5);
    path = w.path();
    w.write_scalars(1, 1700000001.25, {{"train/loss", 2.5f}, {"rollout/reward_mean", 0.25f}});
    w.write_scalars(2, 1700000002.0, {{"train/loss", 1.5f}});
  }
  EXPECT_EQ(fs::path(path).filename().string().rfind("events.out.tfevents.1700000000.", 0), 0u) << path;
  const auto recs = records(read_all(path));
  ASSERT_EQ(recs.size(), 3u);
  const auto version = fields(recs[0]);
  EXPECT_EQ(version.find(3)->second.bytes, "brain.Event:2");
  EXPECT_EQ(as_double(version.find(1)->second.num), 1700000000.5);
  const Scalars s1 = scalars_of(recs[1]), s2 = scalars_of(recs[2]);
  EXPECT_EQ(s1.step, 1);
  EXPECT_EQ(s1.wall_time, 1700000001.25);
  EXPECT_EQ(s1.values, (std::map<std::string, float>{{"train/loss", 2.5f}, {"rollout/reward_mean", 0.25f}}));
  EXPECT_EQ(s2.step, 2);
  EXPECT_EQ(s2.values, (std::map<std::string, float>{{"train/loss", 1.5f}}));
  fs::remove_all(dir);
}

// A second writer in the same second gets its own file (never appends to
// another's), and a restart marker: SessionLog START at the restart step.
TEST(TensorBoardWriter, NewFileEachTimeWithARestartMarker) {
  const std::string dir = temp_dir("restart");
  std::string first, second;
  {
    TensorBoardWriter a(dir, 1700000000.0);
    first = a.path();
    a.write_scalars(1, 1700000000.0, {{"x", 1.0f}});
  }
  const std::string before = read_all(first);
  {
    TensorBoardWriter b(dir, 1700000000.0, 5);
    second = b.path();
    b.write_scalars(5, 1700000000.0, {{"x", 2.0f}});
  }
  EXPECT_NE(first, second);
  EXPECT_EQ(read_all(first), before);
  const auto recs = records(read_all(second));
  ASSERT_EQ(recs.size(), 3u);
  const auto marker = fields(recs[1]);
  EXPECT_EQ(marker.find(2)->second.num, 5u);
  ASSERT_EQ(marker.count(7), 1u);
  EXPECT_EQ(fields(marker.find(7)->second.bytes).find(1)->second.num, 1u);  // status START
  fs::remove_all(dir);
}

TEST(TensorBoardWriter, UnwritableDirectoryIsAnErrorNamingIt) {
  const std::string dir = temp_dir("unwritable");
  std::ofstream(dir + "/file") << "x";
  try {
    TensorBoardWriter w(dir + "/file/tb", 1.0);
    FAIL() << "no error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find(dir + "/file"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

// Through the metrics logger: every numeric metric of a line is a scalar of
// the step's event, under the same name, at the line's "time".
TEST(MetricsLoggerTensorBoard, EveryNumericMetricOfALineIsAScalar) {
  const std::string dir = temp_dir("logger");
  LoggerOptions o;
  o.tensorboard = true;
  std::string events;
  {
    MetricsLogger log(dir + "/metrics.jsonl", MetricsLogger::kAppend, o);
    events = log.tensorboard_path();
    log.log(1, {{"train/loss", 0.75}, {"train/skipped", true}, {"note", "text"}, {"train/tokens", 12}});
    log.log(2, {{"train/loss", std::nan("")}});
  }
  EXPECT_EQ(fs::path(events).parent_path(), fs::path(dir) / "tensorboard");
  const auto lines = read_metrics(dir + "/metrics.jsonl");
  const auto recs = records(read_all(events));
  ASSERT_EQ(recs.size(), 3u);
  ASSERT_EQ(lines.size(), 2u);
  const Scalars s1 = scalars_of(recs[1]);
  EXPECT_EQ(s1.step, 1);
  EXPECT_EQ(s1.wall_time, lines[0]["time"].get<double>());
  EXPECT_EQ(s1.values, (std::map<std::string, float>{
                           {"train/loss", 0.75f}, {"train/skipped", 1.0f}, {"train/tokens", 12.0f}}));
  const Scalars s2 = scalars_of(recs[2]);
  ASSERT_EQ(s2.values.count("train/loss"), 1u);
  EXPECT_TRUE(std::isnan(s2.values.at("train/loss")));
  fs::remove_all(dir);
}

// A resumed logger starts a second events file with a restart marker at the
// first step it writes again; the first file keeps its bytes.
TEST(MetricsLoggerTensorBoard, ResumeStartsANewFileWithARestartMarker) {
  const std::string dir = temp_dir("resume");
  LoggerOptions o;
  o.tensorboard = true;
  std::string first;
  {
    MetricsLogger log(dir + "/metrics.jsonl", MetricsLogger::kAppend, o);
    first = log.tensorboard_path();
    for (int s = 1; s <= 3; ++s) log.log(s, {{"train/loss", 1.0 / s}});
  }
  const std::string before = read_all(first);
  std::string second;
  {
    MetricsLogger log(dir + "/metrics.jsonl", /*keep_through=*/2, o);
    second = log.tensorboard_path();
    log.log(3, {{"train/loss", 0.3}});
  }
  EXPECT_NE(first, second);
  EXPECT_EQ(read_all(first), before);
  EXPECT_EQ(event_files(dir + "/tensorboard").size(), 2u);
  const auto recs = records(read_all(second));
  ASSERT_EQ(recs.size(), 3u);
  const auto marker = fields(recs[1]);
  EXPECT_EQ(marker.find(2)->second.num, 3u);
  EXPECT_EQ(marker.count(7), 1u);
  EXPECT_EQ(scalars_of(recs[2]).values.at("train/loss"), 0.3f);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace lockstep::metrics
