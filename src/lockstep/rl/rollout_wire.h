// The byte format of rollout requests and results sent between the trainer
// root and rollout ranks (and among trainer ranks): every field the RL loop
// and the evaluator use, in a fixed little-endian-as-in-memory layout (all
// ranks of a job run the same build on the same kind of machine). A
// Request's stop_checker is a function and cannot travel: encoding one is an
// error (rl and eval do not use it; stop strings travel as strings).
#pragma once

#include <cstdint>
#include <vector>

#include "lockstep/rollout/engine.h"

namespace lockstep::rl {

std::vector<char> encode_requests(const std::vector<rollout::Request>& requests);
std::vector<rollout::Request> decode_requests(const std::vector<char>& bytes);

// Results plus the number of tokens the engine(s) generated for them.
std::vector<char> encode_results(const std::vector<rollout::RequestResult>& results, int64_t generated_tokens);
std::vector<rollout::RequestResult> decode_results(const std::vector<char>& bytes, int64_t* generated_tokens);

}  // namespace lockstep::rl
