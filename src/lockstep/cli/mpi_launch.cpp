// launched_by_mpi and run_as_job (mpi_launch.h).
#include "lockstep/cli/mpi_launch.h"

#include <cstdlib>
#include <exception>
#include <initializer_list>
#include <iostream>
#include <string>

#include "lockstep/base/error.h"
#include "lockstep/base/toml_section.h"
#include "lockstep/comm/environment.h"

namespace lockstep::cli {

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "PMI_RANK"})
    if (std::getenv(v)) return true;
  return false;
}

parallel::DistConfig read_dist_section(const toml::table& root, const std::string& path, bool* present) {
  const auto* t = root["dist"].as_table();
  if (present) *present = t && !t->empty();
  TomlSection s(t, path, "dist");
  const parallel::DistConfig d = parallel::dist_config_from_toml(s);
  s.finish();
  return d;
}

int run_as_job(const char* cmd, const parallel::DistConfig& d, bool has_dist,
               const std::function<int(parallel::RoleComms*)>& body) {
  // A plain run (no [dist], no launcher) never touches MPI.
  if (!has_dist && !launched_by_mpi()) return body(nullptr);
  comm::Environment env;
  if (env.world_size() == 1) {
    try {
      parallel::compute_roles(d, 1, 0);  // throws for layouts a world of one cannot hold (rollout_ranks = 1)
    } catch (const Error& e) {
      if (comm::kBuiltWithMpi) throw;
      throw Error(std::string("built without MPI (-DLOCKSTEP_MPI=OFF): ") + e.what());
    }
    return body(nullptr);
  }
  try {
    parallel::RoleComms rc = parallel::make_role_comms(d);
    return body(&rc);
  } catch (const std::exception& e) {
    // The other ranks may be waiting for this one in a collective: end the
    // whole job now instead of leaving them to their watchdog.
    std::cerr << "lockstep " << cmd << ": error on rank " << env.world_rank() << " of " << env.world_size() << ": "
              << e.what() << std::endl;
    comm::Environment::abort_job(2);
  }
}

}  // namespace lockstep::cli
