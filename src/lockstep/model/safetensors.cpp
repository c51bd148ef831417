// safetensors reading (mmap + header validation + dtype conversion, tensor
// checksums verified on the way) and writing (F32/BF16 or pre-encoded bytes,
// per-tensor XXH64 in __metadata__, 8-byte-aligned header, atomic files,
// shards + index).
#include "lockstep/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>

#include "lockstep/base/error.h"
#include "lockstep/base/excerpt.h"
#include "lockstep/base/file_util.h"
#include "lockstep/comm/checksum.h"
#include "lockstep/kernels/gpu/backend.h"
#include "lockstep/model/hf_quant.h"

namespace lockstep {

namespace fs = std::filesystem;
using json = nlohmann::json;

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; so must the host be");

namespace {

// The reference implementation refuses headers above 100 MB; so do we.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

size_t element_size(const std::string& dt) {
  return safetensors_dtype_size(dt);
}

std::string shape_string(const std::vector<int64_t>& s) {
  std::string out = "(";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + (s.size() == 1 ? ",)" : ")");
}

int64_t checked_numel(const std::vector<int64_t>& shape, const std::string& what) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) LS_THROW << what << ": negative dimension in shape " << shape_string(shape);
    if (__builtin_mul_overflow(n, d, &n))
      LS_THROW << what << ": shape " << shape_string(shape) << " overflows";
  }
  return n;
}

template <typename T>
void widen_ints(const uint8_t* src, int64_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, src + sizeof(T) * i, sizeof(T));  // data offsets need not be aligned
    dst[i] = static_cast<int64_t>(v);
  }
}

}  // namespace

size_t safetensors_dtype_size(const std::string& dtype) {
  static const std::map<std::string, size_t> sizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"F8_E8M0", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},     {"U32", 4},
      {"F32", 4},  {"I64", 8}, {"U64", 8}, {"F64", 8}};
  auto it = sizes.find(dtype);
  return it == sizes.end() ? 0 : it->second;
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t man = h & 0x3FFu;
  if (exp == 0x1F) return bits_f32(sign | 0x7f800000u | (man << 13));  // inf / NaN (payload kept)
  if (exp == 0) {
    // Zero or subnormal: man * 2^-24, exact in f32.
    const float mag = static_cast<float>(man) * 5.9604644775390625e-8f;
    return sign ? -mag : mag;
  }
  return bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

// ---- reading ----

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) LS_THROW << absolute_path(path) << ": cannot open: " << std::strerror(errno);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    LS_THROW << path << ": cannot stat: " << std::strerror(err);
  }
  size_ = static_cast<uint64_t>(st.st_size);
  if (size_ < 8) {
    ::close(fd);
    LS_THROW << path << ": truncated safetensors file: " << size_
             << " bytes, shorter than the 8-byte header length";
  }
  void* m = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);  // the mapping keeps the file alive
  if (m == MAP_FAILED) LS_THROW << path << ": mmap failed: " << std::strerror(err);
  base_ = static_cast<const uint8_t*>(m);

  try {
    uint64_t n = 0;
    std::memcpy(&n, base_, 8);
    if (n > kMaxHeaderBytes)
      LS_THROW << path << ": header length " << n << " is not sane (limit " << kMaxHeaderBytes
               << "); not a safetensors file?";
    if (n > size_ - 8)
      LS_THROW << path << ": truncated safetensors file: header length " << n << " but only " << size_ - 8
               << " bytes follow";
    if (n < 2 || base_[8] != '{') LS_THROW << path << ": the header does not start with a JSON object";
    json h;
    try {
      h = json::parse(reinterpret_cast<const char*>(base_ + 8), reinterpret_cast<const char*>(base_ + 8 + n));
    } catch (const json::exception& e) {  // parse_error, or out_of_range for 1e400
      LS_THROW << path << ": invalid JSON header: " << excerpt(e.what(), kJsonErrorBytes);
    }
    if (!h.is_object()) LS_THROW << path << ": the header is not a JSON object";
    const uint64_t data_start = 8 + n;
    const uint64_t data_size = size_ - data_start;
    for (auto it = h.begin(); it != h.end(); ++it) {
      const std::string& name = it.key();
      const json& v = it.value();
      if (name == "__metadata__") {
        if (!v.is_object()) LS_THROW << path << ": __metadata__ must be an object";
        for (auto m2 = v.begin(); m2 != v.end(); ++m2)
          metadata_[m2.key()] = m2.value().is_string() ? m2.value().get<std::string>() : m2.value().dump();
        continue;
      }
      const std::string what = path + ": tensor '" + excerpt(name) + "'";
      if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
        LS_THROW << what << ": header entry needs dtype, shape and data_offsets";
      SafetensorsEntry e;
      e.name = name;
      if (!v["dtype"].is_string()) LS_THROW << what << ": dtype must be a string";
      e.dtype = v["dtype"].get<std::string>();
      const size_t esize = element_size(e.dtype);
      if (esize == 0) LS_THROW << what << ": unknown dtype '" << excerpt(e.dtype) << "'";
      if (!v["shape"].is_array()) LS_THROW << what << ": shape must be a list";
      for (const json& d : v["shape"]) {
        if (!d.is_number_integer() || d.get<int64_t>() < 0)
          LS_THROW << what << ": shape must hold non-negative integers, got " << excerpt(v["shape"].dump());
        e.shape.push_back(d.get<int64_t>());
      }
      e.numel = checked_numel(e.shape, what);
      const json& off = v["data_offsets"];
      if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
        LS_THROW << what << ": data_offsets must be [begin, end], got " << excerpt(off.dump());
      const uint64_t b = off[0].get<uint64_t>(), en = off[1].get<uint64_t>();
      if (en < b) LS_THROW << what << ": data_offsets end " << en << " < begin " << b;
      if (en > data_size)
        LS_THROW << path << ": truncated safetensors file: tensor '" << excerpt(name)
                 << "' data ends at byte " << en << " of the data section, which has only " << data_size
                 << " bytes";
      uint64_t need = 0;
      if (__builtin_mul_overflow(static_cast<uint64_t>(e.numel), static_cast<uint64_t>(esize), &need) ||
          need != en - b)
        LS_THROW << what << ": data_offsets span " << en - b << " bytes, but shape " << shape_string(e.shape)
                 << " of " << e.dtype << " needs " << static_cast<uint64_t>(e.numel) * esize;
      e.begin = data_start + b;
      e.end = data_start + en;
      entries_.push_back(std::move(e));
    }
    std::sort(entries_.begin(), entries_.end(),
              [](const SafetensorsEntry& a, const SafetensorsEntry& b) { return a.begin < b.begin; });
    for (size_t i = 0; i < entries_.size(); ++i) index_[entries_[i].name] = i;
    parse_checksums();
  } catch (...) {
    ::munmap(const_cast<uint8_t*>(base_), size_);
    base_ = nullptr;
    throw;
  }
}

void SafetensorsFile::parse_checksums() {
  const std::string prefix = kChecksumKeyPrefix;
  size_t found = 0;
  for (const auto& [key, value] : metadata_) {
    if (key.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string name = key.substr(prefix.size());
    auto it = index_.find(name);
    if (it == index_.end())
      LS_THROW << path_ << ": __metadata__ key '" << excerpt(key) << "' gives the checksum of tensor '"
               << excerpt(name) << "', which the file does not hold (file corrupt)";
    SafetensorsEntry& e = entries_[it->second];
    if (!comm::parse_checksum_hex(value, &e.checksum))
      LS_THROW << path_ << ": __metadata__ key '" << excerpt(key) << "' = '" << excerpt(value)
               << "' is not 16 lowercase hex digits (file corrupt)";
    e.has_checksum = true;
    ++found;
  }
  if (found == 0 || found == entries_.size()) return;
  for (const auto& e : entries_)
    if (!e.has_checksum)
      LS_THROW << path_ << ": tensor '" << excerpt(e.name)
               << "' has no checksum while the file's other tensors have one (file corrupt)";
}

SafetensorsFile::~SafetensorsFile() {
  if (base_) ::munmap(const_cast<uint8_t*>(base_), size_);
}

const SafetensorsEntry* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

namespace {
// Elements per chunk of a verified read: about 1 MiB of stored bytes.
constexpr size_t kScanBytes = size_t{1} << 20;
}  // namespace

namespace {
// Drops the mapped file pages wholly inside [p, p + n) from the process's
// resident set once read: a model's file would otherwise stay resident beside
// the buffers it was read into (twice the weights at the end of a load). The
// mapping is private and never written, so a later read of those bytes (a
// second verification) faults them in again from the file, unchanged.
void release_read_pages(const uint8_t* p, size_t n) {
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(p) + page - 1) / page * page;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + n) / page * page;
  if (end <= begin) return;
  void* start = reinterpret_cast<void*>(begin);  // NOLINT(performance-no-int-to-ptr)
  ::madvise(start, end - begin, MADV_DONTNEED);
}
}  // namespace

template <typename F>
void SafetensorsFile::scan(const SafetensorsEntry& e, size_t esize, F&& convert) const {
  const size_t n = static_cast<size_t>(e.numel);
  const size_t chunk = std::max<size_t>(1, kScanBytes / esize);
  comm::Xxh64 hash;
  for (size_t i = 0; i < n; i += chunk) {
    const size_t m = std::min(chunk, n - i);
    if (e.has_checksum) hash.update(data(e) + i * esize, m * esize);
    convert(i, m);
    release_read_pages(data(e) + i * esize, m * esize);
  }
  if (e.has_checksum && hash.digest() != e.checksum)
    LS_THROW << path_ << ": tensor '" << excerpt(e.name) << "' fails its checksum (file corrupt)";
}

void SafetensorsFile::verify(const SafetensorsEntry& e) const {
  if (e.has_checksum && comm::checksum64(data(e), e.end - e.begin) != e.checksum)
    LS_THROW << path_ << ": tensor '" << excerpt(e.name) << "' fails its checksum (file corrupt)";
}

void SafetensorsFile::read_f32(const SafetensorsEntry& e, float* dst) const {
  const uint8_t* src = data(e);
  // Data offsets need not be aligned: copy through memcpy.
  if (e.dtype == "F32") {
    scan(e, 4, [&](size_t i, size_t m) { std::memcpy(dst + i, src + 4 * i, m * 4); });
  } else if (e.dtype == "BF16") {
    scan(e, 2, [&](size_t i0, size_t m) {
      for (size_t i = i0; i < i0 + m; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        dst[i] = bf16_to_f32(h);
      }
    });
  } else if (e.dtype == "F16") {
    scan(e, 2, [&](size_t i0, size_t m) {
      for (size_t i = i0; i < i0 + m; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        dst[i] = f16_to_f32(h);
      }
    });
  } else if (e.dtype == "F8_E4M3") {
    scan(e, 1, [&](size_t i0, size_t m) {
      for (size_t i = i0; i < i0 + m; ++i) dst[i] = fp8_to_f32(src[i]);
    });
  } else if (e.dtype == "F8_E8M0") {
    scan(e, 1, [&](size_t i0, size_t m) {
      for (size_t i = i0; i < i0 + m; ++i) dst[i] = e8m0_to_f32(src[i]);
    });
  } else {
    LS_THROW << path_ << ": tensor '" << excerpt(e.name) << "' has dtype " << e.dtype
             << "; lockstep reads floats from F32, BF16, F16, F8_E4M3 and F8_E8M0";
  }
}

void SafetensorsFile::read_i64(const SafetensorsEntry& e, int64_t* dst) const {
  const uint8_t* src = data(e);
  auto widen = [&](auto tag) {
    using T = decltype(tag);
    scan(e, sizeof(T), [&](size_t i, size_t m) { widen_ints<T>(src + sizeof(T) * i, dst + i, m); });
  };
  if (e.dtype == "I64") {
    scan(e, 8, [&](size_t i, size_t m) { std::memcpy(dst + i, src + 8 * i, m * 8); });
  } else if (e.dtype == "I32") {
    widen(int32_t{});
  } else if (e.dtype == "I16") {
    widen(int16_t{});
  } else if (e.dtype == "I8") {
    widen(int8_t{});
  } else if (e.dtype == "U32") {
    widen(uint32_t{});
  } else if (e.dtype == "U16") {
    widen(uint16_t{});
  } else if (e.dtype == "U8") {
    widen(uint8_t{});
  } else {
    LS_THROW << path_ << ": tensor '" << excerpt(e.name) << "' has dtype " << e.dtype
             << "; lockstep reads integers from I8, I16, I32, I64, U8, U16 and U32";
  }
}

void SafetensorsFile::read_bytes(const SafetensorsEntry& e, void* dst) const {
  const size_t esize = safetensors_dtype_size(e.dtype);
  auto* out = static_cast<uint8_t*>(dst);
  scan(e, esize, [&](size_t i, size_t m) { std::memcpy(out + i * esize, data(e) + i * esize, m * esize); });
}

// ---- checkpoint (single or sharded) ----

namespace {
const char* kSingleName = "model.safetensors";
const char* kIndexName = "model.safetensors.index.json";
}  // namespace

SafetensorsCheckpoint::SafetensorsCheckpoint(const std::string& path) {
  std::error_code ec;
  auto add_file = [&](const std::string& p) {
    files_.push_back(std::make_unique<SafetensorsFile>(p));
    return files_.size() - 1;
  };
  if (fs::is_regular_file(path, ec)) {
    source_ = path;
    const size_t f = add_file(path);
    for (const auto& e : files_[f]->entries()) where_[e.name] = f;
    return;
  }
  if (!fs::is_directory(path, ec)) LS_THROW << path << ": no such checkpoint file or directory";
  const fs::path dir(path);
  // Hugging Face prefers the single file when both exist; so do we.
  if (fs::is_regular_file(dir / kSingleName, ec)) {
    source_ = (dir / kSingleName).string();
    const size_t f = add_file(source_);
    for (const auto& e : files_[f]->entries()) where_[e.name] = f;
    return;
  }
  if (!fs::is_regular_file(dir / kIndexName, ec))
    LS_THROW << path << ": no " << kSingleName << " or " << kIndexName << " in this directory";
  source_ = (dir / kIndexName).string();
  sharded_ = true;
  json idx;
  try {
    idx = json::parse(read_file_text(source_));
  } catch (const json::exception& e) {  // parse_error, or out_of_range for 1e400
    LS_THROW << source_ << ": invalid JSON: " << excerpt(e.what(), kJsonErrorBytes);
  }
  if (!idx.is_object() || !idx.contains("weight_map") || !idx["weight_map"].is_object())
    LS_THROW << source_ << ": missing required field 'weight_map'";
  std::map<std::string, size_t> by_shard;
  for (auto it = idx["weight_map"].begin(); it != idx["weight_map"].end(); ++it) {
    if (!it.value().is_string())
      LS_THROW << source_ << ": weight_map['" << excerpt(it.key()) << "'] must be a file name";
    const std::string shard = it.value().get<std::string>();
    // Shards live in the same directory; refuse paths that climb out of it.
    if (shard.find('/') != std::string::npos || shard == ".." || shard.empty())
      LS_THROW << source_ << ": weight_map['" << excerpt(it.key()) << "'] = '" << excerpt(shard)
               << "' is not a file name in " << path;
    auto s = by_shard.find(shard);
    if (s == by_shard.end()) {
      const fs::path sp = dir / shard;
      if (!fs::is_regular_file(sp, ec))
        LS_THROW << source_ << ": shard '" << excerpt(shard) << "' (holding '" << excerpt(it.key())
                 << "') does not exist";
      s = by_shard.emplace(shard, add_file(sp.string())).first;
    }
    if (!files_[s->second]->find(it.key()))
      LS_THROW << source_ << ": maps tensor '" << excerpt(it.key()) << "' to shard '" << excerpt(shard)
               << "', which does not contain it";
    where_[it.key()] = s->second;
  }
  // Tensors a shard holds but the index omits still count (as extras).
  for (size_t f = 0; f < files_.size(); ++f)
    for (const auto& e : files_[f]->entries()) where_.emplace(e.name, f);
}

SafetensorsCheckpoint::Located SafetensorsCheckpoint::locate(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) LS_THROW << source_ << ": missing tensor '" << name << "'";
  const SafetensorsFile* f = files_[it->second].get();
  return {f, f->find(name)};
}

std::vector<std::string> SafetensorsCheckpoint::names() const {
  std::vector<std::string> out;
  out.reserve(where_.size());
  for (const auto& [k, v] : where_) out.push_back(k);
  return out;
}

// ---- writing ----

bool is_shard_file_name(const std::string& name) {
  // model-00001-of-00003.safetensors
  static const std::string kPattern = "model-#####-of-#####.safetensors";
  if (name.size() != kPattern.size()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const bool digit = name[i] >= '0' && name[i] <= '9';
    if (kPattern[i] == '#' ? !digit : name[i] != kPattern[i]) return false;
  }
  return true;
}

namespace {
// The dtype name a tensor is stored as; Error for a raw tensor of an unknown
// dtype or one that sets both data and raw.
std::string stored_dtype(const SafetensorsTensor& t, DType dtype) {
  if (!t.raw) return dtype == DType::BF16 ? "BF16" : "F32";
  if (t.data) LS_THROW << "tensor '" << t.name << "': set data or raw, not both";
  if (safetensors_dtype_size(t.raw_dtype) == 0)
    LS_THROW << "tensor '" << t.name << "': unknown safetensors dtype '" << t.raw_dtype << "'";
  return t.raw_dtype;
}
// Floats of a tensor the writer handles at once: its bf16 scratch, and the
// host copy of a tensor in device memory, stay bounded whatever its size.
constexpr size_t kChunk = size_t{1} << 20;

// Calls fn(values, m) over a tensor's f32 values, kChunk at a time, in order:
// the values themselves in host memory, a copy of each chunk where they lie
// in device memory the host cannot read (a trainer on a device).
void for_each_f32_chunk(const float* data, size_t numel,
                        const std::function<void(const float*, size_t)>& fn) {
  std::vector<unsigned char> keep;
  for (size_t i = 0; i < numel; i += kChunk) {
    const size_t m = std::min(kChunk, numel - i);
    const Tensor chunk(const_cast<float*>(data + i), DType::F32, {int64_t(m)});
    fn(kernels::host_readable(chunk, keep).f32(), m);
  }
}

// A raw tensor's nbytes as host code may read them: a copy where they lie
// in device memory (a trainer on a device keeps DeepSeek-V4's integer
// tid2eid tables there), else the bytes themselves.
const void* host_raw(const SafetensorsTensor& t, uint64_t nbytes, std::vector<unsigned char>& keep) {
  if (nbytes == 0) return t.raw;
  const Tensor bytes(const_cast<void*>(t.raw), DType::FP8E4M3, {int64_t(nbytes)});  // one byte an element
  return kernels::host_readable(bytes, keep).data;
}

// XXH64 of the bytes a tensor is stored as: of the values themselves for
// F32 and raw tensors, of their bf16 rounding (made chunk by chunk, as the
// writer makes it again) for BF16.
uint64_t stored_checksum(const SafetensorsTensor& t, DType dtype, uint64_t nbytes) {
  LS_CHECK(t.data != nullptr || t.raw != nullptr || nbytes == 0) << "tensor " << t.name << " has no data";
  if (t.raw) {
    std::vector<unsigned char> keep;
    return comm::checksum64(host_raw(t, nbytes, keep), nbytes);
  }
  const size_t numel = nbytes / dtype_size(dtype);
  std::vector<bf16_t> scratch(dtype == DType::BF16 ? std::min(numel, kChunk) : 0);
  comm::Xxh64 hash;
  for_each_f32_chunk(t.data, numel, [&](const float* x, size_t m) {
    if (dtype == DType::F32) return hash.update(x, m * 4);
    convert_f32_to_bf16(x, scratch.data(), m);
    hash.update(scratch.data(), m * 2);
  });
  return hash.digest();
}
}  // namespace

uint64_t safetensors_nbytes(const SafetensorsTensor& t, DType dtype) {
  const size_t esize = t.raw ? safetensors_dtype_size(stored_dtype(t, dtype)) : dtype_size(dtype);
  return static_cast<uint64_t>(checked_numel(t.shape, t.name)) * esize;
}

void write_safetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors, DType dtype) {
  if (dtype != DType::F32 && dtype != DType::BF16)
    LS_THROW << path << ": safetensors are written as F32 or BF16, not " << dtype_name(dtype);
  json h = json::object();
  json meta = {{"format", "pt"}};
  uint64_t off = 0;
  for (const auto& t : tensors) {
    if (t.name == "__metadata__" || h.contains(t.name))
      LS_THROW << path << ": duplicate or reserved tensor name '" << t.name << "'";
    const uint64_t nb = safetensors_nbytes(t, dtype);
    h[t.name] = {{"dtype", stored_dtype(t, dtype)}, {"shape", t.shape}, {"data_offsets", {off, off + nb}}};
    meta[kChecksumKeyPrefix + t.name] = comm::checksum_hex(stored_checksum(t, dtype, nb));
    off += nb;
  }
  h["__metadata__"] = std::move(meta);
  std::string header = h.dump();
  // Pad so the data starts 8-byte aligned, as the reference writer does.
  header.append((8 - header.size() % 8) % 8, ' ');
  const uint64_t n = header.size();

  AtomicFile f(path);
  f.write(&n, 8);
  f.write(header);
  std::vector<bf16_t> scratch;
  for (const auto& t : tensors) {
    const size_t numel = static_cast<size_t>(checked_numel(t.shape, t.name));
    LS_CHECK(t.data != nullptr || t.raw != nullptr || numel == 0) << "tensor " << t.name << " has no data";
    if (t.raw) {
      const uint64_t nbytes = safetensors_nbytes(t, dtype);
      std::vector<unsigned char> keep;
      f.write(host_raw(t, nbytes, keep), nbytes);
      continue;
    }
    // Convert in bounded chunks so a huge tensor needs no full bf16 copy.
    scratch.resize(dtype == DType::BF16 ? std::min(numel, kChunk) : 0);
    for_each_f32_chunk(t.data, numel, [&](const float* x, size_t m) {
      if (dtype == DType::F32) return f.write(x, m * 4);
      convert_f32_to_bf16(x, scratch.data(), m);
      f.write(scratch.data(), m * 2);
    });
  }
  f.commit();
}

std::vector<std::string> write_safetensors_sharded(const std::string& dir,
                                                   const std::vector<SafetensorsTensor>& tensors, DType dtype,
                                                   uint64_t max_shard_bytes) {
  LS_CHECK(max_shard_bytes > 0) << "max_shard_bytes must be positive";
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (!fs::is_directory(dir)) LS_THROW << dir << ": cannot create directory: " << ec.message();
  // Greedy in order: start a new shard when the next tensor would overflow this one.
  std::vector<std::vector<SafetensorsTensor>> shards(1);
  uint64_t cur = 0, total = 0;
  for (const auto& t : tensors) {
    const uint64_t nb = safetensors_nbytes(t, dtype);
    if (!shards.back().empty() && cur + nb > max_shard_bytes) {
      shards.emplace_back();
      cur = 0;
    }
    shards.back().push_back(t);
    cur += nb;
    total += nb;
  }
  const fs::path d(dir);
  std::vector<std::string> written;
  if (shards.size() == 1) {
    write_safetensors((d / kSingleName).string(), shards[0], dtype);
    written.push_back(kSingleName);
  } else {
    json weight_map = json::object();
    const size_t n = shards.size();
    for (size_t s = 0; s < n; ++s) {
      char name[64];
      std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", s + 1, n);
      write_safetensors((d / name).string(), shards[s], dtype);
      for (const auto& t : shards[s]) weight_map[t.name] = name;
      written.push_back(name);
    }
    json idx = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    write_file_atomic((d / kIndexName).string(), idx.dump(2) + "\n");
    written.push_back(kIndexName);
  }
  // Remove what a previous save into this directory left behind and that
  // would otherwise shadow or confuse this one.
  for (const auto& entry : fs::directory_iterator(d, ec)) {
    const std::string name = entry.path().filename().string();
    const bool ours = std::find(written.begin(), written.end(), name) != written.end();
    if (!ours && (name == kSingleName || name == kIndexName || is_shard_file_name(name)))
      fs::remove(entry.path(), ec);
  }
  sync_directory(dir);
  return written;
}

}  // namespace lockstep
