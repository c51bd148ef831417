// Training checkpoints: checkpoints/step_N/ holds the model in Hugging Face
// layout (config.json + safetensors, plus tokenizer files copied from the
// source model), optimizer.bin, trainer_state.json and checksums.json (the
// XXH64 of every file but the weights, whose tensors carry their own:
// checkpoint_integrity.h). A checkpoint is
// written into step_N.tmp/ and renamed, and checkpoints/latest is replaced
// atomically afterwards, so "latest" never names a half-written checkpoint;
// a checkpoint is removed by renaming it to step_N.old first, so none is
// ever half removed under its own name (docs/rl.md, "Crash safety").
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "lockstep/train/trainer.h"

namespace lockstep::train {

struct CheckpointInfo {
  int64_t step = 0;
  std::string dir;       // .../checkpoints/step_N
  nlohmann::json state;  // trainer_state.json (step, data position, rng, user fields)
};

// The N of a published checkpoint directory's name "step_N"; -1 for anything
// else (step_N.tmp being written, step_N.old being removed, latest, ...).
int64_t checkpoint_step_of(const std::string& name);

// Writes checkpoints/step_<step>/ under run_dir and points `latest` at it.
// `state` is stored as trainer_state.json (its "step" is set here);
// `tokenizer_dir`, if not empty, is where tokenizer files are copied from.
// Keeps only the newest `keep_last` checkpoints when keep_last > 0.
// `extra`, if set, writes more into the checkpoint's directory (given as its
// argument) before it is published (RL's critic/ folder).
std::string save_checkpoint(const std::string& run_dir, int64_t step, Trainer& trainer, nlohmann::json state,
                            const std::string& tokenizer_dir = "", int keep_last = 0,
                            const std::function<void(const std::string& dir)>& extra = {});

// What killed runs left in run_dir: half-written step_N.tmp and half-removed
// step_N.old directories and a gathered optimizer state
// (checkpoints/optimizer.gathered) under checkpoints/, and temporary files of dead
// writers in run_dir, checkpoints/, samples/ and eval/. Run by the writer
// before it writes anything (the directory has no other writer).
void remove_crash_leftovers(const std::string& run_dir);

// A fresh run (no --resume) into run_dir: an Error when the directory already
// holds a run (a non-empty metrics.jsonl), naming it and --resume. Called
// before the run writes anything there, so a refused run changes nothing.
void refuse_existing_run(const std::string& run_dir);

// The checkpoint `latest` names, if any (Error if it names a missing or
// incomplete checkpoint). It is not verified: a resume goes through
// find_resume_checkpoint (checkpoint_integrity.h), which is.
std::optional<CheckpointInfo> find_latest_checkpoint(const std::string& run_dir);

// Loads parameters and optimizer state of a checkpoint into the trainer
// (whose model config must match) and returns its state.
CheckpointInfo load_checkpoint(const CheckpointInfo& info, Trainer& trainer);

}  // namespace lockstep::train
