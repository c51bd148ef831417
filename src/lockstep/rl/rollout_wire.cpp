// Encoding of rollout requests and results: a tag and a format version, then
// the fields in declaration order; vectors and strings are length-prefixed.
#include "lockstep/rl/rollout_wire.h"

#include <cstring>
#include <string>
#include <type_traits>

#include "lockstep/base/error.h"

namespace lockstep::rl {

namespace {

// "LSRQ" / "LSRS" + format version 2 (2: a sample ends with its
// indexer_topk): a message of the other kind or of another build's format is
// refused instead of misread.
constexpr uint32_t kRequestsTag = 0x5152534cu, kResultsTag = 0x5352534cu;
constexpr uint32_t kFormatVersion = 2;

// The fewest bytes one element takes on the wire (all its vectors and strings
// empty): a count of n elements needs n times that many bytes left, checked
// before n elements are allocated, so a corrupt count cannot make a small
// message allocate hundreds of times its size.
constexpr size_t kMinParamsBytes = 4 + 8 + 4 + 4 + 8 + 8 + 8 + 1 + 8 + 8 + 1;
constexpr size_t kMinRequestBytes = 8 + kMinParamsBytes + 1;
constexpr size_t kMinResultBytes = 8 + 8 + 8;
constexpr size_t kMinSampleBytes = 8 + 8 + 8 + 8 + 8 + 8 + 8 + 8 + 8;

class Writer {
 public:
  template <typename T>
  void put(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const char* p = reinterpret_cast<const char*>(&v);
    out_.insert(out_.end(), p, p + sizeof(T));
  }
  template <typename T>
  void put_vec(const std::vector<T>& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    put(uint64_t(v.size()));
    const char* p = reinterpret_cast<const char*>(v.data());
    out_.insert(out_.end(), p, p + v.size() * sizeof(T));
  }
  void put_str(const std::string& s) {
    put(uint64_t(s.size()));
    out_.insert(out_.end(), s.begin(), s.end());
  }
  std::vector<char> take() { return std::move(out_); }

 private:
  std::vector<char> out_;
};

class Reader {
 public:
  Reader(const std::vector<char>& in, const char* what) : in_(in), what_(what) {}
  template <typename T>
  T get() {
    static_assert(std::is_trivially_copyable_v<T>);
    T v;
    std::memcpy(&v, take(sizeof(T)), sizeof(T));
    return v;
  }
  template <typename T>
  std::vector<T> get_vec() {
    const uint64_t n = count(sizeof(T));
    std::vector<T> v(static_cast<size_t>(n));
    if (n) std::memcpy(v.data(), take(size_t(n) * sizeof(T)), size_t(n) * sizeof(T));
    return v;
  }
  std::string get_str() {
    const uint64_t n = count(1);
    const char* p = take(size_t(n));
    return std::string(p, size_t(n));
  }
  // A count of elements that take at least `elem` bytes each.
  uint64_t count(size_t elem) {
    const uint64_t n = get<uint64_t>();
    if (n > (in_.size() - pos_) / elem)
      LS_THROW << what_ << ": a count of " << n << " at byte " << pos_ << " runs past the end of the "
               << in_.size() << "-byte message (corrupt or truncated)";
    return n;
  }
  void header(uint32_t tag) {
    const uint32_t t = get<uint32_t>(), v = get<uint32_t>();
    if (t != tag) LS_THROW << what_ << ": not a message of this kind (tag " << t << ")";
    if (v != kFormatVersion)
      LS_THROW << what_ << ": format version " << v << ", this build reads " << kFormatVersion
               << " (every rank must run the same lockstep build)";
  }
  void finish() const {
    if (pos_ != in_.size())
      LS_THROW << what_ << ": " << in_.size() - pos_ << " bytes left over after the last field";
  }

 private:
  const char* take(size_t n) {
    if (n > in_.size() - pos_)
      LS_THROW << what_ << ": message of " << in_.size() << " bytes ends inside a field at byte " << pos_;
    const char* p = in_.data() + pos_;
    pos_ += n;
    return p;
  }
  const std::vector<char>& in_;
  const char* what_;
  size_t pos_ = 0;
};

void put_params(Writer& w, const rollout::SamplingParams& p) {
  w.put(p.temperature);
  w.put(p.top_k);
  w.put(p.top_p);
  w.put(p.min_p);
  w.put(p.max_new_tokens);
  w.put_vec(p.stop_token_ids);
  w.put(uint64_t(p.stop.size()));
  for (const auto& s : p.stop) w.put_str(s);
  w.put(uint8_t(p.ignore_eos));
  w.put(p.n);
  w.put(p.seed);
  w.put(uint8_t(p.return_logprobs));
}

rollout::SamplingParams get_params(Reader& r) {
  rollout::SamplingParams p;
  p.temperature = r.get<float>();
  p.top_k = r.get<int64_t>();
  p.top_p = r.get<float>();
  p.min_p = r.get<float>();
  p.max_new_tokens = r.get<int64_t>();
  p.stop_token_ids = r.get_vec<int32_t>();
  const uint64_t n_stop = r.count(sizeof(uint64_t));
  for (uint64_t i = 0; i < n_stop; ++i) p.stop.push_back(r.get_str());
  p.ignore_eos = r.get<uint8_t>() != 0;
  p.n = r.get<int64_t>();
  p.seed = r.get<int64_t>();
  p.return_logprobs = r.get<uint8_t>() != 0;
  return p;
}

}  // namespace

std::vector<char> encode_requests(const std::vector<rollout::Request>& requests) {
  Writer w;
  w.put(kRequestsTag);
  w.put(kFormatVersion);
  w.put(uint64_t(requests.size()));
  for (size_t i = 0; i < requests.size(); ++i) {
    const rollout::Request& q = requests[i];
    if (q.stop_checker)
      LS_THROW << "rollout request " << i << " has a stop_checker, which cannot be sent to a rollout rank "
               << "(use stop token ids or stop strings)";
    w.put_vec(q.prompt_ids);
    put_params(w, q.params);
    w.put(uint8_t(q.return_experts));
  }
  return w.take();
}

std::vector<rollout::Request> decode_requests(const std::vector<char>& bytes) {
  Reader r(bytes, "rollout requests");
  r.header(kRequestsTag);
  const uint64_t n = r.count(kMinRequestBytes);
  std::vector<rollout::Request> out(static_cast<size_t>(n));
  for (auto& q : out) {
    q.prompt_ids = r.get_vec<int32_t>();
    q.params = get_params(r);
    q.return_experts = r.get<uint8_t>() != 0;
  }
  r.finish();
  return out;
}

std::vector<char> encode_results(const std::vector<rollout::RequestResult>& results, int64_t generated_tokens) {
  Writer w;
  w.put(kResultsTag);
  w.put(kFormatVersion);
  w.put(generated_tokens);
  w.put(uint64_t(results.size()));
  for (const auto& q : results) {
    w.put(q.id);
    w.put_vec(q.prompt_ids);
    w.put(uint64_t(q.samples.size()));
    for (const auto& s : q.samples) {
      w.put_vec(s.output_ids);
      w.put_vec(s.logprobs);
      w.put_str(s.finish_reason);
      w.put_vec(s.routed_experts);
      w.put(s.weight_version);
      w.put(s.weight_version_end);
      w.put(s.ttft_s);
      w.put(s.latency_s);
      w.put_vec(s.indexer_topk);
    }
  }
  return w.take();
}

std::vector<rollout::RequestResult> decode_results(const std::vector<char>& bytes, int64_t* generated_tokens) {
  Reader r(bytes, "rollout results");
  r.header(kResultsTag);
  const int64_t tokens = r.get<int64_t>();
  if (generated_tokens) *generated_tokens = tokens;
  const uint64_t n = r.count(kMinResultBytes);
  std::vector<rollout::RequestResult> out(static_cast<size_t>(n));
  for (auto& q : out) {
    q.id = r.get<uint64_t>();
    q.prompt_ids = r.get_vec<int32_t>();
    const uint64_t ns = r.count(kMinSampleBytes);
    q.samples.resize(static_cast<size_t>(ns));
    for (auto& s : q.samples) {
      s.output_ids = r.get_vec<int32_t>();
      s.logprobs = r.get_vec<float>();
      s.finish_reason = r.get_str();
      s.routed_experts = r.get_vec<int32_t>();
      s.weight_version = r.get<uint64_t>();
      s.weight_version_end = r.get<uint64_t>();
      s.ttft_s = r.get<double>();
      s.latency_s = r.get<double>();
      s.indexer_topk = r.get_vec<int32_t>();
    }
  }
  r.finish();
  return out;
}

}  // namespace lockstep::rl
