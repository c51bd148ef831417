// `lockstep demo`: the embedded end-to-end run. Until the RL loop lands it
// runs the most complete thing that exists, the kernel self-check, and says so.
#include <iostream>

#include "lockstep/base/thread_pool.h"
#include "lockstep/cli/command.h"
#include "lockstep/cli/selfcheck.h"

namespace lockstep::cli {
namespace {

int run_demo(const Args& args) {
  args.check_known({"out", "seed"});
  std::cout << "lockstep demo: the RL demo (issue 8) is not built yet; running the most complete\n"
               "part that exists instead: the kernel self-check (reference comparison and\n"
               "batch invariance of every CPU kernel on random inputs).\n\n";
  return run_selfcheck(std::cout) ? 0 : 1;
}

LS_REGISTER_COMMAND(Command{"demo", "run the embedded end-to-end demo",
                            "usage: lockstep demo [--out DIR] [--seed N]\n\n"
                            "Runs the embedded demo. The RL demo is not built yet; today this runs the\n"
                            "kernel self-check.\n",
                            {}, run_demo});

}  // namespace
}  // namespace lockstep::cli
