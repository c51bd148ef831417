// Parquet reading: the Thrift compact decoder and the RLE/bit-packed hybrid on
// hand-built bytes, the codecs, a real file (tests/data/fixtures, written by
// hyparquet-writer) read as rows and loaded as a prompt dataset, and that
// truncated or corrupted copies of it are Errors naming the file, never a crash.
#include "lockstep/data/parquet.h"

#include <gtest/gtest.h>
#include <snappy-c.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "lockstep/base/error.h"
#include "lockstep/base/file_util.h"
#include "lockstep/data/dataset.h"
#include "lockstep/data/parquet_codec.h"
#include "lockstep/data/parquet_column.h"
#include "lockstep/data/parquet_format.h"
#include "lockstep/data/rle_hybrid.h"
#include "lockstep/data/rows.h"
#include "lockstep/data/thrift_compact.h"
#include "lockstep/tokenizer/byte_level.h"
#include "parquet_builder.h"

namespace lockstep::data {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Tests run in the build directory; __FILE__ is relative to it or absolute.
std::string fixture_path() {
  return (fs::path(__FILE__).parent_path() / "fixtures" / "verl_small.parquet").string();
}

std::string temp_path(const std::string& name) {
  return (fs::temp_directory_path() / ("lockstep_parquet_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// struct { 1: i32 -3, 2: binary "ab", 10: list<i32> [1, 2], 300: i64 -1,
//          301: struct { 1: bool true }, 302: double 0.5 }
const std::vector<uint8_t> kThriftStruct = {
    0x15, 0x05,                                   // field 1 (delta 1), i32, zigzag(-3) = 5
    0x18, 0x02, 'a',  'b',                        // field 2, binary of 2 bytes
    0x89, 0x25, 0x02, 0x04,                       // field 10 (delta 8), list of 2 i32: 1, 2
    0x06, 0xd8, 0x04, 0x01,                       // field id 300 in long form, i64 zigzag(-1) = 1
    0x1c, 0x11, 0x00,                             // field 301, struct { field 1: true }
    0x17, 0,    0,    0,    0, 0, 0, 0xe0, 0x3f,  // field 302, double 0.5
    0x00};

TEST(ThriftCompact, DecodesFieldsListsAndNestedStructs) {
  ThriftReader r(kThriftStruct.data(), kThriftStruct.size(), "hand-built");
  std::vector<int16_t> ids;
  r.read_struct([&](int16_t id, ThriftType t) {
    ids.push_back(id);
    if (id == 1) {
      EXPECT_EQ(r.read_i32(), -3);
    }
    if (id == 2) {
      EXPECT_EQ(r.read_binary(), "ab");
    }
    if (id == 10) {
      const ThriftListHeader h = r.read_list_header();
      ASSERT_EQ(h.size, 2);
      EXPECT_EQ(h.elem_type, ThriftType::kI32);
      EXPECT_EQ(r.read_i32(), 1);
      EXPECT_EQ(r.read_i32(), 2);
    }
    if (id == 300) {
      EXPECT_EQ(r.read_i64(), -1);
    }
    if (id == 301) {
      r.read_struct([&](int16_t inner, ThriftType it) {
        EXPECT_EQ(inner, 1);
        EXPECT_TRUE(ThriftReader::field_bool(it));
      });
    }
    if (id == 302) {
      EXPECT_EQ(r.read_double(), 0.5);
    }
    (void)t;
  });
  EXPECT_EQ(ids, (std::vector<int16_t>{1, 2, 10, 300, 301, 302}));
  EXPECT_EQ(r.pos(), kThriftStruct.size());

  ThriftReader skipper(kThriftStruct.data(), kThriftStruct.size(), "hand-built");
  skipper.skip(ThriftType::kStruct);
  EXPECT_EQ(skipper.pos(), kThriftStruct.size());
}

TEST(ThriftCompact, TruncationAndGarbageAreErrors) {
  for (size_t n = 0; n < kThriftStruct.size(); ++n) {
    ThriftReader r(kThriftStruct.data(), n, "cut");
    const std::string e = error_of([&] { r.skip(ThriftType::kStruct); });
    EXPECT_NE(e.find("cut: "), std::string::npos) << "prefix of " << n << " bytes: " << e;
  }
  // A list claiming a billion elements in a few bytes, a string longer than
  // the data, an unknown type code.
  const std::vector<uint8_t> huge_list = {0x19, 0xf5, 0x80, 0x94, 0xeb, 0xdc, 0x03, 0x00};
  const std::vector<uint8_t> long_string = {0x18, 0x7f, 'x', 0x00};
  const std::vector<uint8_t> bad_type = {0x1d, 0x00};
  for (const auto* bytes : {&huge_list, &long_string, &bad_type}) {
    ThriftReader r(bytes->data(), bytes->size(), "garbage");
    EXPECT_NE(error_of([&] { r.skip(ThriftType::kStruct); }).find("garbage: "), std::string::npos);
  }
}

TEST(RleHybrid, DecodesRunsAndBitPackedGroups) {
  using parquet::decode_rle_hybrid;
  // A run of five 4s, then one bit-packed group of 0..7 at width 3 (the
  // example of parquet-format's Encodings.md).
  const std::vector<uint8_t> bytes = {0x0a, 0x04, 0x03, 0x88, 0xc6, 0xfa};
  std::vector<uint32_t> out;
  decode_rle_hybrid(bytes.data(), bytes.size(), 3, 13, &out);
  EXPECT_EQ(out, (std::vector<uint32_t>{4, 4, 4, 4, 4, 0, 1, 2, 3, 4, 5, 6, 7}));
  decode_rle_hybrid(bytes.data(), bytes.size(), 3, 7, &out);  // the last group padded past the count
  EXPECT_EQ(out, (std::vector<uint32_t>{4, 4, 4, 4, 4, 0, 1}));
  // Width 0 (a one-entry dictionary): runs carry no value bytes.
  const std::vector<uint8_t> zero = {0x10};
  decode_rle_hybrid(zero.data(), zero.size(), 0, 8, &out);
  EXPECT_EQ(out, std::vector<uint32_t>(8, 0));
  EXPECT_EQ(parquet::bit_width_for(0), 0);
  EXPECT_EQ(parquet::bit_width_for(1), 1);
  EXPECT_EQ(parquet::bit_width_for(7), 3);
  EXPECT_EQ(parquet::bit_width_for(8), 4);
}

TEST(RleHybrid, ShortStreamsAreErrors) {
  using parquet::decode_rle_hybrid;
  const std::vector<uint8_t> bytes = {0x0a, 0x04, 0x03, 0x88, 0xc6, 0xfa};
  std::vector<uint32_t> out;
  for (size_t n = 0; n < bytes.size(); ++n)
    EXPECT_FALSE(error_of([&] { decode_rle_hybrid(bytes.data(), n, 3, 13, &out); }).empty()) << n;
  EXPECT_FALSE(error_of([&] { decode_rle_hybrid(bytes.data(), bytes.size(), 3, 14, &out); }).empty());
  EXPECT_FALSE(error_of([&] { decode_rle_hybrid(bytes.data(), bytes.size(), 33, 1, &out); }).empty());
  const std::vector<uint8_t> empty_run = {0x00, 0x01};
  EXPECT_NE(
      error_of([&] { decode_rle_hybrid(empty_run.data(), empty_run.size(), 1, 1, &out); }).find("length 0"),
      std::string::npos);
}

TEST(ParquetPlain, DecodesEachPhysicalType) {
  parquet::SchemaElement e;
  e.type = parquet::kBoolean;
  const std::vector<uint8_t> bits = {0b00000101};
  EXPECT_EQ(json(parquet::decode_plain(bits.data(), 1, e, 3)), json::parse("[true, false, true]"));
  e.type = parquet::kByteArray;
  const std::vector<uint8_t> strings = {2, 0, 0, 0, 'h', 'i', 0, 0, 0, 0};
  EXPECT_EQ(json(parquet::decode_plain(strings.data(), strings.size(), e, 2)), json::parse(R"(["hi", ""])"));
  EXPECT_NE(error_of([&] { parquet::decode_plain(strings.data(), 5, e, 1); }).find("past the end"),
            std::string::npos);
  // Bytes that are not UTF-8 become U+FFFD, as a JSON string must be.
  const std::vector<uint8_t> binary = {3, 0, 0, 0, 'a', 0xff, 'b'};
  EXPECT_EQ(parquet::decode_plain(binary.data(), binary.size(), e, 1)[0],
            "a\xef\xbf\xbd"
            "b");
  e.type = parquet::kInt32;
  const std::vector<uint8_t> ints = {0xff, 0xff, 0xff, 0xff, 7, 0, 0, 0};
  EXPECT_EQ(json(parquet::decode_plain(ints.data(), ints.size(), e, 2)), json::parse("[-1, 7]"));
  e.converted_type = parquet::kUint32;
  EXPECT_EQ(json(parquet::decode_plain(ints.data(), ints.size(), e, 2)), json::parse("[4294967295, 7]"));
  e = {};
  e.type = parquet::kDouble;
  const double d = -2.5;
  const auto* dp = reinterpret_cast<const uint8_t*>(&d);
  const json dv = parquet::decode_plain(dp, 8, e, 1)[0];
  EXPECT_TRUE(dv.is_number_float());
  EXPECT_EQ(dv.get<double>(), -2.5);
  EXPECT_FALSE(error_of([&] { parquet::decode_plain(dp, 8, e, 2); }).empty());
  e.type = parquet::kFixedLenByteArray;
  e.type_length = 2;
  const std::vector<uint8_t> fixed = {'a', 'b', 'c', 'd'};
  EXPECT_EQ(json(parquet::decode_plain(fixed.data(), fixed.size(), e, 2)), json::parse(R"(["ab", "cd"])"));
}

TEST(ParquetCodec, RoundTripsAndRejectsCorruptData) {
  std::string text;
  for (int i = 0; i < 2000; ++i) text += "row " + std::to_string(i % 37) + ";";
  const auto* in = reinterpret_cast<const uint8_t*>(text.data());

  std::string z(ZSTD_compressBound(text.size()), '\0');
  z.resize(ZSTD_compress(z.data(), z.size(), text.data(), text.size(), 3));
  std::string s(snappy_max_compressed_length(text.size()), '\0');
  size_t s_len = s.size();
  ASSERT_EQ(snappy_compress(text.data(), text.size(), s.data(), &s_len), SNAPPY_OK);
  s.resize(s_len);
  uLongf g_len = compressBound(uLong(text.size()));
  std::string g(g_len, '\0');
  ASSERT_EQ(compress2(reinterpret_cast<Bytef*>(g.data()), &g_len, in, uLong(text.size()), 6), Z_OK);
  g.resize(g_len);

  for (auto [codec, bytes] : {std::pair{parquet::kZstd, &z}, {parquet::kSnappy, &s}, {parquet::kGzip, &g}}) {
    const auto* p = reinterpret_cast<const uint8_t*>(bytes->data());
    EXPECT_EQ(parquet::decompress(codec, p, bytes->size(), text.size()), text) << parquet::codec_name(codec);
    const std::string name = parquet::codec_name(codec);
    EXPECT_NE(error_of([&] { parquet::decompress(codec, p, bytes->size(), text.size() + 1); }).find(name),
              std::string::npos);
    EXPECT_NE(error_of([&] { parquet::decompress(codec, p, bytes->size() / 2, text.size()); }).find(name),
              std::string::npos);
  }
  EXPECT_EQ(parquet::decompress(parquet::kUncompressed, in, text.size(), text.size()), text);
  EXPECT_NE(error_of([&] { parquet::decompress(parquet::kSnappy, in, 10, size_t(1) << 40); }).find("beyond"),
            std::string::npos);
  EXPECT_NE(error_of([&] { parquet::decompress(5, in, 10, 10); }).find("unsupported compression codec LZ4"),
            std::string::npos);
}

TEST(Parquet, ReadsVerlStyleRows) {
  const auto rows = read_parquet(fixture_path());
  ASSERT_EQ(rows.size(), 5u);
  EXPECT_EQ(rows[1], json::parse(R"({
    "data_source": "openai/gsm8k",
    "prompt": [{"role": "system", "content": "Answer with a number."},
               {"role": "user", "content": "What is 1 + 2?"}],
    "ability": "math",
    "reward_model": {"ground_truth": "3", "style": "rule"},
    "extra_info": {"index": 1, "split": "train", "score": 1.5}})"));
  EXPECT_TRUE(rows[1]["extra_info"]["index"].is_number_integer());
  EXPECT_TRUE(rows[2]["extra_info"]["score"].is_null());
  EXPECT_EQ(rows[4]["extra_info"]["split"], "test");
}

TEST(Parquet, RowsDispatchOnTheExtension) {
  const auto parquet_rows = read_rows(fixture_path());
  ASSERT_EQ(parquet_rows.size(), 5u);
  EXPECT_EQ(parquet_rows[0].line, 1);
  EXPECT_EQ(parquet_rows[4].line, 5);
  const std::string jsonl = temp_path("rows.jsonl");
  std::ofstream(jsonl) << parquet_rows[3].value.dump() << "\n";
  const auto jsonl_rows = read_rows(jsonl);
  ASSERT_EQ(jsonl_rows.size(), 1u);
  EXPECT_EQ(jsonl_rows[0].value, parquet_rows[3].value);
  fs::remove(jsonl);
}

TEST(Parquet, LoadsAsAPromptDataset) {
  const fs::path dir = temp_path("tok");
  tokenizer::write_byte_level_tokenizer(dir);
  const auto tok = tokenizer::Tokenizer::load(dir.string());
  DataConfig cfg;
  cfg.messages_key = "prompt";
  cfg.label_key = "reward_model";
  cfg.metadata_key = "extra_info";
  const auto examples = load_prompts(fixture_path(), cfg, tok);
  ASSERT_EQ(examples.size(), 5u);
  EXPECT_EQ(examples[2].line, 3);
  EXPECT_NE(examples[2].prompt_text.find("What is 2 + 4?"), std::string::npos);
  EXPECT_EQ(examples[2].label["ground_truth"], "6");
  EXPECT_EQ(examples[3].metadata["index"], 3);
  // Errors name the file, the row and the field.
  cfg.messages_key = "messages";
  cfg.prompt_key = "question";
  const std::string e = error_of([&] { load_prompts(fixture_path(), cfg, tok); });
  EXPECT_NE(e.find("verl_small.parquet:1: "), std::string::npos) << e;
  EXPECT_NE(e.find("'question'"), std::string::npos) << e;
  fs::remove_all(dir);
}

TEST(Parquet, BadFilesAreErrorsNamingTheFile) {
  const std::string good = read_file_text(fixture_path());
  const std::string name = "corrupt.parquet";
  EXPECT_NE(error_of([&] { parse_parquet("PAR1", name); }).find("corrupt.parquet: not a parquet file"),
            std::string::npos);
  std::string bad_len = good;
  bad_len[bad_len.size() - 5] = char(0x7f);  // footer length high byte
  EXPECT_NE(error_of([&] { parse_parquet(bad_len, name); }).find("footer length"), std::string::npos);
  // Every truncation: an Error naming the file, never a crash.
  for (size_t n = 0; n < good.size(); ++n) {
    const std::string e = error_of([&] { parse_parquet(good.substr(0, n), name); });
    EXPECT_EQ(e.rfind(name + ": ", 0), 0u) << "truncated to " << n << ": " << e;
  }
  // Every byte flipped: rows or an Error naming the file (most flips in page
  // data name the column too); anything else escapes and fails the test.
  int column_errors = 0;
  for (size_t i = 0; i < good.size(); ++i) {
    std::string flipped = good;
    flipped[i] = char(flipped[i] ^ 0xff);
    const std::string e = error_of([&] { parse_parquet(flipped, name); });
    if (!e.empty()) {
      EXPECT_EQ(e.rfind(name + ": ", 0), 0u) << "byte " << i << ": " << e;
    }
    column_errors += e.find("column '") != std::string::npos;
  }
  EXPECT_GT(column_errors, 0);
}

// `ids`, a legacy 2-level LIST (a repeated int32 under the LIST group), rows
// [1, 2], [] and null: repetition levels 0 1 0 0, definition levels 2 2 1 0.
testing::ColumnSpec two_level_list() {
  testing::ColumnSpec c;
  c.schema = {{"ids", -1, parquet::kOptional, 1, parquet::kList},
              {"array", parquet::kInt32, parquet::kRepeated}};
  c.path = {"ids", "array"};
  c.type = parquet::kInt32;
  c.page_values = 4;
  c.num_rows = 3;
  const char body[] = {2, 0, 0, 0, 0x03, 0x02,            // rep levels: one bit-packed group, 0 1 0 0
                       3, 0, 0, 0, 0x03, 0x1a, 0x00,      // def levels at width 2: 2 2 1 0
                       1, 0, 0, 0, 2,    0,    0,    0};  // PLAIN int32 values 1, 2
  c.body.assign(body, sizeof(body));
  return c;
}

TEST(ParquetBuilt, LegacyTwoLevelList) {
  const auto rows = parse_parquet(testing::build_parquet(two_level_list()), "two_level.parquet");
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0], json::parse(R"({"ids": [1, 2]})"));
  EXPECT_EQ(rows[1], json::parse(R"({"ids": []})"));
  EXPECT_EQ(rows[2], json::parse(R"({"ids": null})"));
}

TEST(ParquetBuilt, FaultsNameTheFileAndColumn) {
  auto expect = [](const testing::ColumnSpec& c, const std::string& needle) {
    const std::string e = error_of([&] { parse_parquet(testing::build_parquet(c), "built.parquet"); });
    EXPECT_EQ(e.rfind("built.parquet: ", 0), 0u) << e;
    EXPECT_NE(e.find(needle), std::string::npos) << e;
  };
  auto c = two_level_list();
  c.chunk_values = 5;
  expect(c,
         "column 'ids.array' (row group 0): value count mismatch: the column chunk says 5 values, its pages "
         "hold 4");
  c.chunk_values = 1000000000;
  expect(c, "column 'ids.array' claims 1000000000 values, more than a file of");
  c = two_level_list();
  c.codec = 4;
  expect(c, "column 'ids.array' (row group 0): unsupported compression codec BROTLI");
  c = two_level_list();
  c.encoding = 5;
  expect(c, "column 'ids.array' (row group 0): unsupported encoding DELTA_BINARY_PACKED");
  c = two_level_list();
  c.num_rows = 4;
  expect(c, "row group 0: column 'ids.array': fewer values than the rows need");
  c = two_level_list();
  c.body[11] = 0x1b;  // a definition level of 3, above the column's maximum 2
  expect(c, "level 3 above the column's maximum 2");

  testing::ColumnSpec ts;
  ts.schema = {{"ts", parquet::kInt96, parquet::kRequired}};
  ts.path = {"ts"};
  ts.type = parquet::kInt96;
  ts.page_values = 1;
  ts.num_rows = 1;
  ts.body = std::string(12, '\0');
  expect(ts, "column 'ts' (row group 0): INT96 values (legacy timestamps) are not supported");
}

}  // namespace
}  // namespace lockstep::data
