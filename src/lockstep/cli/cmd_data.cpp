// `lockstep data`: prints a dataset file's rows as the loaders see them (a
// JSONL file's lines, a parquet file's rows), one compact JSON object a line.
#include <cstdio>
#include <iostream>

#include "lockstep/base/error.h"
#include "lockstep/cli/command.h"
#include "lockstep/data/rows.h"

namespace lockstep::cli {
namespace {

constexpr const char* kHelp =
    "usage: lockstep data FILE [--rows N]\n"
    "\n"
    "Prints the rows of a dataset file as `sft`, `rl`, `eval` and `generate` read them:\n"
    "one JSON object per line (compact). FILE is JSONL, or parquet when its name ends in\n"
    ".parquet; nested parquet columns print as JSON objects and arrays, nulls as null,\n"
    "and integers, floats, booleans and strings keep their types.\n"
    "\n"
    "  --rows N   print only the first N rows\n"
    "\n"
    "See docs/data.md for the parquet types, encodings and compressions read.\n";

int run_data(const Args& args) {
  args.check_known({"rows"});
  const auto& pos = args.positional();
  if (pos.empty()) LS_THROW << "data: name a dataset file: `lockstep data FILE [--rows N]`";
  if (pos.size() > 1) LS_THROW << "data: expected one file, got " << pos.size() << " arguments";
  const int64_t limit = args.get_int("rows", -1);
  if (args.has("rows") && limit < 0) LS_THROW << "--rows must be >= 0, got " << limit;
  const auto rows = data::read_rows(pos[0]);
  int64_t printed = 0;
  for (const auto& r : rows) {
    if (limit >= 0 && printed >= limit) break;
    std::cout << r.value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
    ++printed;
  }
  std::cout.flush();
  if (!std::cout) LS_THROW << "data: cannot write to standard output";
  return 0;
}

LS_REGISTER_COMMAND(Command{
    "data", "print a JSONL or parquet dataset's rows as JSON lines", kHelp, {}, run_data});

}  // namespace
}  // namespace lockstep::cli
