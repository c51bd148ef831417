// Checkpoint verification (checksums.json, tensor checksums, the files a
// resume needs) and the choice of the checkpoint a resumed run starts from.
#include "lockstep/train/checkpoint_integrity.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "lockstep/base/error.h"
#include "lockstep/base/excerpt.h"
#include "lockstep/base/file_util.h"
#include "lockstep/base/log.h"
#include "lockstep/comm/checksum.h"
#include "lockstep/model/safetensors.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace lockstep::train {

namespace {

// XXH64 of a whole file, read in 1 MiB pieces.
uint64_t file_checksum(const fs::path& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) LS_THROW << path.string() << ": cannot open: " << std::strerror(errno);
  std::vector<unsigned char> buf(size_t{1} << 20);
  comm::Xxh64 hash;
  size_t n = 0;
  while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) hash.update(buf.data(), n);
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) LS_THROW << path.string() << ": read error";
  return hash.digest();
}

bool covered_by_manifest(const fs::directory_entry& e) {
  const std::string name = e.path().filename().string();
  return e.is_regular_file() && name != kChecksumManifest && !name.ends_with(".safetensors");
}

// checksums.json against the files: "" or what differs.
std::string manifest_problem(const fs::path& dir) {
  const fs::path path = dir / kChecksumManifest;
  if (!fs::exists(path)) return "";  // written before checkpoints had checksums
  json m;
  try {
    m = json::parse(read_file_text(path.string()));
  } catch (const json::exception& e) {
    return path.string() + ": invalid JSON: " + excerpt(e.what(), kJsonErrorBytes);
  }
  if (!m.is_object() || !m.contains("files") || !m["files"].is_object() ||
      m.value("algorithm", "") != "xxh64")
    return path.string() + ": not a checksum manifest ({\"algorithm\": \"xxh64\", \"files\": {...}})";
  for (const auto& [name, value] : m["files"].items()) {
    uint64_t want = 0;
    if (!value.is_string() || !comm::parse_checksum_hex(value.get<std::string>(), &want))
      return path.string() + ": the checksum of '" + excerpt(name) + "' is not 16 lowercase hex digits";
    if (name.find('/') != std::string::npos || name == "..")
      return path.string() + ": '" + excerpt(name) + "' is not a file name";
    const fs::path file = dir / name;
    if (!fs::is_regular_file(file)) return file.string() + ": missing (listed in " + kChecksumManifest + ")";
    if (file_checksum(file) != want) return file.string() + ": fails its checksum (file corrupt)";
  }
  return "";
}

// trainer_state.json: parses, and its step is the directory's N.
std::string state_problem(const fs::path& dir) {
  const fs::path path = dir / "trainer_state.json";
  try {
    const json state = json::parse(read_file_text(path.string()));
    const int64_t step = state.at("step").get<int64_t>();
    const int64_t named = checkpoint_step_of(dir.filename().string());
    if (named >= 0 && step != named)
      return path.string() + ": step " + std::to_string(step) + " in a checkpoint named " +
             dir.filename().string();
  } catch (const json::exception& e) {
    return path.string() + ": " + excerpt(e.what(), kJsonErrorBytes);
  }
  try {
    if (!json::parse(read_file_text((dir / "config.json").string())).is_object())
      return (dir / "config.json").string() + ": not a JSON object";
  } catch (const json::exception& e) {
    return (dir / "config.json").string() + ": invalid JSON: " + excerpt(e.what(), kJsonErrorBytes);
  }
  return "";
}

// Every safetensors header check, and every tensor against its checksum.
std::string weights_problem(const fs::path& dir) {
  try {
    SafetensorsCheckpoint ckpt(dir.string());
    for (const std::string& name : ckpt.names()) {
      const auto at = ckpt.locate(name);
      at.file->verify(*at.entry);
    }
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

CheckpointInfo read_info(const fs::path& dir) {
  CheckpointInfo info;
  info.dir = dir.string();
  info.state = json::parse(read_file_text((dir / "trainer_state.json").string()));
  info.step = info.state.at("step").get<int64_t>();
  return info;
}

// The checkpoints a plain --resume may use, newest first: the one `latest`
// names (even if missing: it is reported), then the published step_N older
// than it. A newer step_N (published, not yet named by latest) is not one.
std::vector<fs::path> resume_candidates(const fs::path& root, const std::string& latest_name) {
  const int64_t latest_step = checkpoint_step_of(latest_name);
  std::vector<std::pair<int64_t, fs::path>> older;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const int64_t s = checkpoint_step_of(e.path().filename().string());
    if (s >= 0 && e.is_directory() && (latest_step < 0 || s < latest_step)) older.emplace_back(s, e.path());
  }
  std::sort(older.rbegin(), older.rend());
  std::vector<fs::path> out = {root / latest_name};
  for (auto& [s, p] : older) out.push_back(p);
  return out;
}

// "step_N", "N" or a directory path -> the checkpoint directory.
fs::path explicit_checkpoint(const fs::path& root, const std::string& from) {
  const bool digits =
      !from.empty() && std::all_of(from.begin(), from.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (digits) return root / ("step_" + from);
  if (checkpoint_step_of(from) >= 0 && !fs::exists(from)) return root / from;
  return fs::path(from);
}

}  // namespace

void write_checksum_manifest(const std::string& dir) {
  json files = json::object();
  for (const auto& e : fs::directory_iterator(dir))
    if (covered_by_manifest(e))
      files[e.path().filename().string()] = comm::checksum_hex(file_checksum(e.path()));
  const json m = {{"algorithm", "xxh64"}, {"files", files}};
  write_file_atomic((fs::path(dir) / kChecksumManifest).string(), m.dump(2) + "\n");
}

std::string checkpoint_problem(const std::string& dir_path) {
  const fs::path dir(dir_path);
  if (!fs::is_directory(dir)) return dir.string() + ": no such checkpoint directory";
  for (const char* f : {"config.json", "trainer_state.json", "optimizer.bin"})
    if (!fs::is_regular_file(dir / f)) return dir.string() + ": incomplete checkpoint, no " + f;
  try {
    for (auto* check : {manifest_problem, state_problem, weights_problem}) {
      std::string p = check(dir);
      if (!p.empty()) return p;
    }
  } catch (const Error& e) {  // a file that cannot be read
    return e.what();
  }
  return "";
}

std::optional<CheckpointInfo> find_resume_checkpoint(const std::string& run_dir, const std::string& from,
                                                     bool announce) {
  const fs::path root = fs::path(run_dir) / "checkpoints";
  if (!from.empty()) {
    const fs::path dir = explicit_checkpoint(root, from);
    const std::string problem = checkpoint_problem(dir.string());
    if (!problem.empty())
      LS_THROW << "--resume-from " << from << ": cannot resume from " << dir.string() << ": " << problem;
    return read_info(dir);
  }
  const fs::path latest = root / "latest";
  if (!fs::exists(latest)) return std::nullopt;
  std::string name = read_file_text(latest.string());
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  std::vector<std::pair<std::string, std::string>> broken;  // name, problem
  for (const fs::path& dir : resume_candidates(root, name)) {
    const std::string problem = checkpoint_problem(dir.string());
    if (!problem.empty()) {
      broken.emplace_back(dir.filename().string(), problem);
      continue;
    }
    if (announce && !broken.empty()) {
      for (const auto& [bad, why] : broken)
        LS_LOG(Warn) << "--resume: checkpoint " << bad << " is corrupt or incomplete: " << why;
      LS_LOG(Warn) << "--resume: falling back to " << dir.filename().string()
                   << ", the newest intact checkpoint; the steps after it are trained again";
    }
    return read_info(dir);
  }
  std::ostringstream os;
  os << "--resume: no intact checkpoint in " << root.string() << " (latest names " << excerpt(name) << "):";
  for (const auto& [bad, why] : broken) os << "\n  " << bad << ": " << why;
  LS_THROW << os.str();
}

}  // namespace lockstep::train
