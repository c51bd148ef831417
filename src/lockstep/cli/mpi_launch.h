// How a command that can run as an MPI job (rl, sft) starts: MPI only when a
// launcher (mpirun, srun) started this process (Open MPI's
// OMPI_COMM_WORLD_SIZE, PMIx's PMIX_RANK or PMI's PMI_SIZE/PMI_RANK in the
// environment) or the config has a non-empty [dist] section.
#pragma once

#include <functional>
#include <string>

#include <toml++/toml.h>

#include "lockstep/parallel/dist_config.h"
#include "lockstep/parallel/role_comms.h"

namespace lockstep::cli {

bool launched_by_mpi();

// The [dist] section of a command's config (all defaults when absent;
// errors name `path` and the key); *present: it has at least one key.
parallel::DistConfig read_dist_section(const toml::table& root, const std::string& path, bool* present);

// Runs `body` as this process's part of the job: body(nullptr) without MPI
// (no launcher and no [dist]) or in a world of one rank (after checking that
// the layout fits one rank); otherwise body(&roles) on every rank. An error
// on a rank prints "lockstep CMD: error on rank R of W: ..." and ends the
// whole job at once (MPI_Abort), so no rank is left waiting in a collective.
int run_as_job(const char* cmd, const parallel::DistConfig& d, bool has_dist,
               const std::function<int(parallel::RoleComms*)>& body);

}  // namespace lockstep::cli
