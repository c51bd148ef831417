// MPI return codes to lockstep::Error with the library's own message.
// Used inside comm/ only.
#pragma once

#include <string>

namespace lockstep::comm {

std::string mpi_error_string(int code);
// Throws Error "<what>: <MPI error string>" when code != MPI_SUCCESS.
void check_mpi(int code, const char* what);

}  // namespace lockstep::comm
