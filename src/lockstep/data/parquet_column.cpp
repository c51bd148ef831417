// Column chunk decoding: walks the pages (dictionary, data v1, data v2),
// decompresses them, decodes levels with the RLE hybrid and values with PLAIN,
// dictionary indices or RLE booleans.
#include "lockstep/data/parquet_column.h"

#include <cstring>

#include "lockstep/base/error.h"
#include "lockstep/base/excerpt.h"
#include "lockstep/data/parquet_codec.h"
#include "lockstep/data/rle_hybrid.h"
#include "lockstep/tokenizer/unicode.h"

namespace lockstep::data::parquet {

namespace {

// Strings are UTF-8 in JSON: bytes that are not (a binary column's) become
// U+FFFD, so that every later consumer sees what a JSONL file could hold.
nlohmann::json text(const uint8_t* p, size_t n) {
  const std::string_view s(reinterpret_cast<const char*>(p), n);
  return tokenizer::utf8_is_valid(s) ? std::string(s) : tokenizer::utf8_sanitize(s);
}

template <typename V>
V load_le(const uint8_t* p) {
  V v;
  std::memcpy(&v, p, sizeof(V));
  return v;
}

bool is_unsigned(const SchemaElement& e) {
  return e.converted_type == kUint32 || e.converted_type == kUint64 || e.converted_type == 11 ||
         e.converted_type == 12 || e.converted_type == 13 || e.logical_unsigned;  // 11..13: UINT_8/16/32
}

size_t fixed_width(const SchemaElement& e) {
  switch (e.type) {
    case kInt32:
    case kFloat: return 4;
    case kInt64:
    case kDouble: return 8;
    case kFixedLenByteArray:
      if (e.type_length <= 0) LS_THROW << "FIXED_LEN_BYTE_ARRAY with type_length " << e.type_length;
      return size_t(e.type_length);
    default: return 0;
  }
}

nlohmann::json fixed_value(const SchemaElement& e, const uint8_t* p) {
  switch (e.type) {
    case kInt32:
      return is_unsigned(e) ? nlohmann::json(load_le<uint32_t>(p)) : nlohmann::json(load_le<int32_t>(p));
    case kInt64:
      return is_unsigned(e) ? nlohmann::json(load_le<uint64_t>(p)) : nlohmann::json(load_le<int64_t>(p));
    case kFloat: return double(load_le<float>(p));
    case kDouble: return load_le<double>(p);
    default: return text(p, size_t(e.type_length));
  }
}

// A 4-byte little-endian length, then that many bytes (v1 levels, RLE booleans).
std::pair<const uint8_t*, size_t> length_prefixed(const uint8_t* p, size_t n, const char* what) {
  if (n < 4) LS_THROW << what << ": missing length prefix";
  const uint32_t len = load_le<uint32_t>(p);
  if (len > n - 4) LS_THROW << what << ": length " << len << " past the end of the page";
  return {p + 4, len};
}

class ChunkReader {
 public:
  ChunkReader(const ColumnMeta& meta, const SchemaNode& leaf) : meta_(meta), leaf_(leaf) {}

  void read(const uint8_t* data, size_t limit);
  ColumnData take() { return std::move(out_); }

 private:
  void dictionary_page(const PageHeader& h, const uint8_t* body);
  void data_page_v1(const PageHeader& h, const uint8_t* body);
  void data_page_v2(const PageHeader& h, const uint8_t* body);
  size_t levels(const uint8_t* p, size_t n, int max_level, size_t count, std::vector<uint8_t>* out);
  void values(const uint8_t* p, size_t n, int32_t encoding, size_t count);

  const ColumnMeta& meta_;
  const SchemaNode& leaf_;
  std::vector<nlohmann::json> dict_;
  bool has_dict_ = false;
  ColumnData out_;
  std::vector<uint32_t> scratch_;
};

void ChunkReader::read(const uint8_t* data, size_t limit) {
  if (meta_.type != leaf_.element.type) LS_THROW << "column chunk type differs from the schema's";
  if (leaf_.element.type == kInt96) LS_THROW << "INT96 values (legacy timestamps) are not supported";
  if (leaf_.element.type < kBoolean || leaf_.element.type > kFixedLenByteArray)
    LS_THROW << "unknown physical type " << leaf_.element.type;
  int64_t start = meta_.data_page_offset;
  if (meta_.dictionary_page_offset >= 4 && meta_.dictionary_page_offset < start)
    start = meta_.dictionary_page_offset;
  if (start < 4 || meta_.total_compressed_size < 0 || uint64_t(start) > limit ||
      uint64_t(meta_.total_compressed_size) > limit - uint64_t(start))
    LS_THROW << "column chunk [" << start << ", +" << meta_.total_compressed_size
             << ") outside the file's data";
  if (meta_.num_values < 0) LS_THROW << "negative value count";
  size_t pos = size_t(start);
  const size_t end = pos + size_t(meta_.total_compressed_size);
  while (int64_t(out_.def.size()) < meta_.num_values) {
    if (pos >= end) break;
    const PageHeader h = parse_page_header(data + pos, end - pos, "page at byte " + std::to_string(pos));
    const size_t body = pos + h.header_size;
    if (size_t(h.compressed_size) > end - body)
      LS_THROW << "page at byte " << pos << " of " << h.compressed_size
               << " bytes runs past its column chunk";
    if (h.num_values > kMaxPageValues)
      LS_THROW << "page at byte " << pos << " claims " << h.num_values << " values";
    if (h.type == kDictionaryPage) {
      dictionary_page(h, data + body);
    } else if (h.type == kDataPage) {
      data_page_v1(h, data + body);
    } else if (h.type == kDataPageV2) {
      data_page_v2(h, data + body);
    }
    pos = body + size_t(h.compressed_size);
  }
  if (int64_t(out_.def.size()) != meta_.num_values)
    LS_THROW << "value count mismatch: the column chunk says " << meta_.num_values
             << " values, its pages hold " << out_.def.size();
}

void ChunkReader::dictionary_page(const PageHeader& h, const uint8_t* body) {
  if (has_dict_) LS_THROW << "second dictionary page in one column chunk";
  if (h.encoding != kPlain && h.encoding != kPlainDictionary)
    LS_THROW << "unsupported dictionary encoding " << encoding_name(h.encoding);
  const std::string page =
      decompress(meta_.codec, body, size_t(h.compressed_size), size_t(h.uncompressed_size));
  dict_ = decode_plain(reinterpret_cast<const uint8_t*>(page.data()), page.size(), leaf_.element,
                       size_t(h.num_values));
  has_dict_ = true;
}

size_t ChunkReader::levels(const uint8_t* p, size_t n, int max_level, size_t count,
                           std::vector<uint8_t>* out) {
  if (max_level == 0) {
    out->insert(out->end(), count, 0);
    return 0;
  }
  decode_rle_hybrid(p, n, bit_width_for(uint32_t(max_level)), count, &scratch_);
  for (uint32_t v : scratch_) {
    if (v > uint32_t(max_level)) LS_THROW << "level " << v << " above the column's maximum " << max_level;
    out->push_back(static_cast<uint8_t>(v));
  }
  return count;
}

void ChunkReader::data_page_v1(const PageHeader& h, const uint8_t* body) {
  const std::string page =
      decompress(meta_.codec, body, size_t(h.compressed_size), size_t(h.uncompressed_size));
  const auto* p = reinterpret_cast<const uint8_t*>(page.data());
  size_t n = page.size();
  const auto count = size_t(h.num_values);
  const size_t first = out_.def.size();
  for (auto [max_level, encoding, dst] : {std::tuple{leaf_.rep_level, h.rep_encoding, &out_.rep},
                                          std::tuple{leaf_.def_level, h.def_encoding, &out_.def}}) {
    if (max_level == 0) {
      levels(p, n, 0, count, dst);
      continue;
    }
    if (encoding != kRle) LS_THROW << "unsupported level encoding " << encoding_name(encoding);
    auto [lp, ln] = length_prefixed(p, n, "levels");
    levels(lp, ln, max_level, count, dst);
    p += 4 + ln;
    n -= 4 + ln;
  }
  size_t present = 0;
  for (size_t i = first; i < out_.def.size(); ++i) present += out_.def[i] == leaf_.def_level;
  values(p, n, h.encoding, present);
}

void ChunkReader::data_page_v2(const PageHeader& h, const uint8_t* body) {
  const auto rep_n = size_t(h.rep_bytes), def_n = size_t(h.def_bytes);
  if (h.rep_bytes < 0 || h.def_bytes < 0 || rep_n + def_n > size_t(h.compressed_size) ||
      rep_n + def_n > size_t(h.uncompressed_size))
    LS_THROW << "data page v2 level sizes (" << h.rep_bytes << ", " << h.def_bytes << ") past the page";
  const auto count = size_t(h.num_values);
  const size_t first = out_.def.size();
  levels(body, rep_n, leaf_.rep_level, count, &out_.rep);
  levels(body + rep_n, def_n, leaf_.def_level, count, &out_.def);
  const uint8_t* vp = body + rep_n + def_n;
  const size_t vn = size_t(h.compressed_size) - rep_n - def_n;
  const size_t raw_n = size_t(h.uncompressed_size) - rep_n - def_n;
  std::string page;
  if (h.is_compressed) {
    page = decompress(meta_.codec, vp, vn, raw_n);
  } else {
    page = decompress(kUncompressed, vp, vn, raw_n);
  }
  size_t present = 0;
  for (size_t i = first; i < out_.def.size(); ++i) present += out_.def[i] == leaf_.def_level;
  values(reinterpret_cast<const uint8_t*>(page.data()), page.size(), h.encoding, present);
}

void ChunkReader::values(const uint8_t* p, size_t n, int32_t encoding, size_t count) {
  if (count == 0) return;
  if (encoding == kPlain) {
    auto v = decode_plain(p, n, leaf_.element, count);
    out_.values.insert(out_.values.end(), std::make_move_iterator(v.begin()),
                       std::make_move_iterator(v.end()));
  } else if (encoding == kPlainDictionary || encoding == kRleDictionary) {
    if (!has_dict_) LS_THROW << "dictionary-encoded page without a dictionary page";
    if (n < 1) LS_THROW << "dictionary-encoded page without its bit width";
    decode_rle_hybrid(p + 1, n - 1, p[0], count, &scratch_);
    for (uint32_t i : scratch_) {
      if (i >= dict_.size())
        LS_THROW << "dictionary index " << i << " past the dictionary's " << dict_.size();
      out_.values.push_back(dict_[i]);
    }
  } else if (encoding == kRle && leaf_.element.type == kBoolean) {
    auto [bp, bn] = length_prefixed(p, n, "RLE booleans");
    decode_rle_hybrid(bp, bn, 1, count, &scratch_);
    for (uint32_t b : scratch_) out_.values.emplace_back(b != 0);
  } else {
    LS_THROW << "unsupported encoding " << encoding_name(encoding) << " (" << encoding
             << "); lockstep reads PLAIN, PLAIN_DICTIONARY, RLE_DICTIONARY and RLE booleans";
  }
}

}  // namespace

std::vector<nlohmann::json> decode_plain(const uint8_t* data, size_t size, const SchemaElement& leaf,
                                         size_t count) {
  std::vector<nlohmann::json> out;
  if (leaf.type == kBoolean) {
    if ((count + 7) / 8 > size)
      LS_THROW << "PLAIN booleans: " << count << " values need more than " << size << " bytes";
    out.reserve(count);
    for (size_t i = 0; i < count; ++i) out.emplace_back(((data[i >> 3] >> (i & 7)) & 1) != 0);
    return out;
  }
  if (leaf.type == kByteArray) {
    if (count > size / 4)
      LS_THROW << "PLAIN strings: " << count << " values need more than " << size << " bytes";
    out.reserve(count);
    size_t pos = 0;
    for (size_t i = 0; i < count; ++i) {
      if (size - pos < 4) LS_THROW << "PLAIN strings: value " << i << " past the end of the page";
      const uint32_t len = load_le<uint32_t>(data + pos);
      pos += 4;
      if (len > size - pos)
        LS_THROW << "PLAIN strings: value " << i << " of " << len << " bytes past the end";
      out.push_back(text(data + pos, len));
      pos += len;
    }
    return out;
  }
  const size_t w = fixed_width(leaf);
  if (w == 0) LS_THROW << "unsupported physical type " << leaf.type;
  if (count > size / w)
    LS_THROW << "PLAIN values: " << count << " values of " << w << " bytes exceed " << size;
  out.reserve(count);
  for (size_t i = 0; i < count; ++i) out.push_back(fixed_value(leaf, data + i * w));
  return out;
}

ColumnData read_column_chunk(const uint8_t* data, size_t limit, const ColumnMeta& meta,
                             const SchemaNode& leaf, const std::string& file, int row_group) {
  ChunkReader r(meta, leaf);
  try {
    r.read(data, limit);
  } catch (const Error& e) {
    LS_THROW << file << ": column '" << excerpt(leaf.path) << "' (row group " << row_group
             << "): " << e.what();
  }
  return r.take();
}

}  // namespace lockstep::data::parquet
