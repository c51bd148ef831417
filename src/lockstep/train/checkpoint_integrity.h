// Whether a checkpoint is intact, and which one --resume continues from.
// checksums.json in a checkpoint holds the XXH64 of each of its files but
// the safetensors (those carry one per tensor in their header); a checkpoint
// that fails any check is never resumed from: --resume falls back to the
// newest intact one that keep_last kept, --resume-from names one exactly.
#pragma once

#include <optional>
#include <string>

#include "lockstep/train/checkpoint.h"

namespace lockstep::train {

// The manifest's file name inside a checkpoint directory.
inline constexpr const char* kChecksumManifest = "checksums.json";

// Writes dir/checksums.json {"algorithm": "xxh64", "files": {name: 16 hex
// digits}} for every regular file directly in `dir` except *.safetensors and
// the manifest itself (reading each once; called right after they were
// written, so from the page cache). Atomic, like every file of a checkpoint.
void write_checksum_manifest(const std::string& dir);

// Why the checkpoint directory `dir` cannot be resumed from, or "" when it
// is intact: it or one of config.json, trainer_state.json, optimizer.bin is
// missing; trainer_state.json does not parse or gives another step than the
// directory's name; checksums.json does not parse, or a file it lists is
// missing or differs from its checksum; the weights fail their header checks
// (truncation, ...) or a tensor its checksum. A checkpoint without
// checksums.json (from before checksums) passes all checks but those.
std::string checkpoint_problem(const std::string& dir);

// The checkpoint a resumed run starts from (nullopt: none, start at step 0).
// `from` empty: the one checkpoints/latest names if it is intact, else the
// newest intact one before it, with a warning on the console naming the
// broken checkpoint(s), why each is broken, and the one used (`announce`:
// this rank prints; the others choose the same without printing). Error when
// latest names a checkpoint and none is intact, listing each with its
// problem. `from` = "step_N", "N" or the path of a checkpoint directory:
// exactly that checkpoint; Error if it is absent or not intact (no fallback).
std::optional<CheckpointInfo> find_resume_checkpoint(const std::string& run_dir, const std::string& from = "",
                                                     bool announce = true);

}  // namespace lockstep::train
