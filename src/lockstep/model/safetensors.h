// The safetensors format: memory-mapped, validated reading of one file or of a
// sharded checkpoint (model.safetensors.index.json), with F32/BF16/F16 (and
// unscaled F8) → f32 conversion, integer and raw-byte reads; writing of f32
// values as F32 or BF16, or of bytes already encoded in any dtype (F8_E4M3,
// F8_E8M0, I8, I64, ...), atomically, as one file or a sharded set.
// File layout: u64 little-endian header length N, N bytes of JSON header
// {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}},
// then the data; offsets are relative to the first data byte. lockstep's
// writer puts each tensor's XXH64 in __metadata__ ("lockstep.xxh64.<name>":
// 16 hex digits, string values as the format wants) and its reader verifies
// them while it reads; files without them (from elsewhere) load unverified.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/tensor/dtype.h"

namespace lockstep {

struct SafetensorsEntry {
  std::string name;
  std::string dtype;  // as in the file: "F32", "BF16", "F16", "I64", ...
  std::vector<int64_t> shape;
  int64_t numel = 0;
  uint64_t begin = 0;  // absolute byte offsets of the data within the file
  uint64_t end = 0;
  bool has_checksum = false;  // the file's __metadata__ gives its XXH64
  uint64_t checksum = 0;      // of the bytes [begin, end)
};

// The __metadata__ key holding a tensor's checksum: this prefix + its name.
inline constexpr const char* kChecksumKeyPrefix = "lockstep.xxh64.";

// A read-only mapping of one .safetensors file. The constructor validates the
// whole header: file long enough for the 8-byte length, header length sane
// (<= 100 MB) and within the file, JSON that parses to an object, for every
// tensor a known element size, data_offsets inside the file (else: "truncated")
// and end - begin == numel × element size; checksum keys in __metadata__
// that are 16 hex digits and name a tensor of the file, and then one for
// every tensor (a damaged key cannot leave a tensor unchecked). Every Error
// names the file.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }  // in data-offset order
  const SafetensorsEntry* find(const std::string& name) const;               // nullptr if absent
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const uint8_t* data(const SafetensorsEntry& e) const { return base_ + e.begin; }
  // The read_* calls verify a tensor's checksum, if it has one, while they
  // copy it: Error "<file>: tensor '<name>' fails its checksum (file
  // corrupt)" (dst holds its bytes then, which the caller must not use).
  // Converts F32, BF16, F16, F8_E4M3 (e4m3fn) or F8_E8M0 (2^(e-127)) data to
  // f32, exactly (dst has e.numel floats). F8 values come out unscaled: block
  // scales are the caller's (hf_quant.h). Other dtypes throw Error naming the
  // tensor, its dtype and the file.
  void read_f32(const SafetensorsEntry& e, float* dst) const;
  // Converts integer data (I8, I16, I32, I64, U8, U16, U32) to int64 (dst has
  // e.numel values); other dtypes throw Error naming the tensor and the file.
  void read_i64(const SafetensorsEntry& e, int64_t* dst) const;
  // Copies the tensor's bytes as stored (e.end - e.begin of them, little-endian).
  void read_bytes(const SafetensorsEntry& e, void* dst) const;
  // The same check for a caller that reads data(e) itself; nothing for a
  // tensor without a checksum.
  void verify(const SafetensorsEntry& e) const;
  bool has_checksums() const { return !entries_.empty() && entries_.front().has_checksum; }

 private:
  void parse_checksums();
  // Calls convert(first element, count) over the tensor in chunks of about
  // 1 MiB, hashing each chunk just before it is converted (one pass over the
  // bytes), then checks the checksum.
  template <typename F>
  void scan(const SafetensorsEntry& e, size_t esize, F&& convert) const;

  std::string path_;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// A checkpoint directory: model.safetensors.index.json (sharded) if present,
// else model.safetensors. A path to a single .safetensors file also works.
class SafetensorsCheckpoint {
 public:
  explicit SafetensorsCheckpoint(const std::string& path);

  // Where tensor `name` lives, or nullptr. For a sharded checkpoint the entry
  // comes from the shard the index names (Error if that shard lacks it).
  struct Located {
    const SafetensorsFile* file;
    const SafetensorsEntry* entry;
  };
  bool contains(const std::string& name) const { return where_.count(name) != 0; }
  Located locate(const std::string& name) const;  // Error naming tensor and source if absent
  std::vector<std::string> names() const;         // sorted
  // The file that names the tensors: the index, or the single file. Errors cite it.
  const std::string& source() const { return source_; }
  bool sharded() const { return sharded_; }

 private:
  std::string source_;
  bool sharded_ = false;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t> where_;  // tensor name -> files_ index
};

// Bytes per element of a safetensors dtype name ("F32", "F8_E8M0", "I64",
// ...); 0 for a name the format does not define.
size_t safetensors_dtype_size(const std::string& dtype);

// A tensor to write: either f32 values (data), converted to the writer's
// dtype, or bytes already encoded (raw, raw_dtype: a safetensors dtype name),
// written as they are whatever the writer's dtype. Exactly one of data and
// raw is set (both may be null for an empty tensor).
struct SafetensorsTensor {
  std::string name;
  std::vector<int64_t> shape;
  const float* data = nullptr;  // numel(shape) floats
  const void* raw = nullptr;    // numel(shape) x safetensors_dtype_size(raw_dtype) bytes
  std::string raw_dtype = "";   // empty unless raw
};

// Bytes one tensor takes in a file whose f32 values are stored as `dtype`.
uint64_t safetensors_nbytes(const SafetensorsTensor& t, DType dtype);

// Writes one file: header with `__metadata__` {"format": "pt"} and the XXH64
// of each tensor's stored bytes ("lockstep.xxh64.<name>"), padded with
// spaces to a multiple of 8 bytes (as the reference writer does), data in the
// given order. f32 values are stored as dtype F32 or BF16 (round to nearest
// even); raw tensors as their raw_dtype. Written to a temporary file and
// renamed, so an existing file is never half-overwritten.
void write_safetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors, DType dtype);

// Writes `tensors` into `dir` as model.safetensors if they fit in
// max_shard_bytes, else as model-0000i-of-0000n.safetensors plus
// model.safetensors.index.json (metadata.total_size, weight_map). A tensor
// larger than the limit gets a shard of its own. Returns the files written.
std::vector<std::string> write_safetensors_sharded(const std::string& dir,
                                                   const std::vector<SafetensorsTensor>& tensors, DType dtype,
                                                   uint64_t max_shard_bytes);

// Whether `name` is "model-NNNNN-of-NNNNN.safetensors" (a shard this writer names).
bool is_shard_file_name(const std::string& name);

// IEEE half → f32, exact.
float f16_to_f32(uint16_t h);

}  // namespace lockstep
