// A TOML table written back as text, every float in its shortest exact form
// (toml++'s own printer writes 17 significant digits in this build:
// 3e-4 came out as 0.00029999999999999997).
#pragma once

#include <toml++/toml.h>

#include <string>

namespace lockstep {

// Top-level keys first, then one [section] per table (nested: [a.b]);
// arrays and tables inside arrays inline. Reads back to an equal table.
std::string toml_text(const toml::table& root);

}  // namespace lockstep
