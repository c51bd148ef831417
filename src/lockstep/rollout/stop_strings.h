// Stop strings: a Request::stop_checker built from a tokenizer. A stop string
// is searched in the text of the sample's last tokens only (a string of b
// bytes spans at most b tokens), so each check is O(longest stop string).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "lockstep/tokenizer/tokenizer.h"

namespace lockstep::rollout {

// Returns a checker giving the number of output tokens to keep (all of them:
// the token that completes a stop string is kept, as vLLM does) when a stop
// string appears, else -1.
std::function<int64_t(const std::vector<int32_t>&)> make_stop_checker(const tokenizer::Tokenizer& tok,
                                                                       std::vector<std::string> stops);

// The response text with everything from the first stop string on removed.
std::string cut_at_stop(const std::string& text, const std::vector<std::string>& stops);

}  // namespace lockstep::rollout
