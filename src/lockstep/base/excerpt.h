// excerpt(): how an error message quotes text it was given (a key, a value, a
// name from a file or a request): short, printable, and never a copy of a
// large or binary input.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace lockstep {

// At most `max_bytes` of `s` (cut before a UTF-8 character that would not
// fit), with control bytes, DEL and bytes that are not well-formed UTF-8
// written as \xNN; when cut, "... (N bytes)" follows. Quote it yourself.
std::string excerpt(std::string_view s, size_t max_bytes = 64);

// How much of a JSON parser's message to keep: nlohmann's quotes the last
// token read ("last read: '...'"), which can be most of the input, with each
// control byte spelled <U+0009>.
constexpr size_t kJsonErrorBytes = 256;

}  // namespace lockstep
