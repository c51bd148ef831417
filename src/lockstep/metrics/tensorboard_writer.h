// TensorBoard event files: serialized tensorboard.Event messages (scalar
// summaries, the file version, a restart marker) in TFRecord framing, one
// new file per process, written so that a live TensorBoard sees every step.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace lockstep::metrics {

// Event payloads (tensorboard/compat/proto/event.proto field numbers:
// wall_time 1, step 2, file_version 3, summary 5, session_log 7).
std::string file_version_event(double wall_time);
// Summary { Value { tag = 1; simple_value = 2 } ... } at `step`.
std::string scalars_event(double wall_time, int64_t step,
                          const std::vector<std::pair<std::string, float>>& values);
// SessionLog { status = START }: TensorBoard drops what it holds for steps
// >= `step` (data a crashed run logged before the step it resumes from).
std::string session_start_event(double wall_time, int64_t step);

class TensorBoardWriter {
 public:
  // Creates `dir` and a new file dir/events.out.tfevents.<secs>.<host>.<pid>.<k>
  // (k: the first free number), and writes the "brain.Event:2" record, then a
  // restart marker at restart_step when that is >= 0. Never appends to an
  // existing file, so a resumed run cannot corrupt an earlier one.
  TensorBoardWriter(const std::string& dir, double wall_time, int64_t restart_step = -1);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // One record with every value of the step, in a single write() (no fsync:
  // the record is visible to readers at once; metrics.jsonl is the durable log).
  void write_scalars(int64_t step, double wall_time,
                     const std::vector<std::pair<std::string, float>>& values);
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& payload);

  std::string path_;
  int fd_ = -1;
};

}  // namespace lockstep::metrics
