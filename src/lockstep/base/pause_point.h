// Pause points for crash tests: named places inside the writing of run files
// (checkpoints, metrics.jsonl, samples, eval files, the report) where a
// process can be told to stop and wait, so that a test can SIGKILL it exactly
// there (tests/torture/). Inert unless LOCKSTEP_PAUSE_AT is set.
#pragma once

#include <string>

namespace lockstep {

// With LOCKSTEP_PAUSE_AT="POINT" or "POINT:N", the N-th time (1 if omitted)
// this process reaches `point`, it appends "POINT DETAIL\n" to the file named
// by LOCKSTEP_PAUSE_NOTIFY (stderr if that is unset) and sleeps until it is
// killed. `detail` says where (the file being written); "POINT@TEXT:N"
// counts only the hits whose detail contains TEXT. "POINT:0" only
// appends that line at every hit and goes on (a trace); POINT "*" is every
// point. Otherwise it returns at once. The points are listed in docs/rl.md
// ("Crash safety").
void pause_point(const char* point, const std::string& detail);

// Whether LOCKSTEP_PAUSE_AT names `point` (whatever its N): a writer that
// normally issues one write() splits it in two around its pause point, so
// the pause lands between the halves (a torn line).
bool pause_point_armed(const char* point);

}  // namespace lockstep
