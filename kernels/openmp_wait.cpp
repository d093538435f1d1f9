// A short OpenMP spin before sleeping, by default (see openmp_wait.h).
#include "memplan/kernels/openmp_wait.h"

#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <string>

namespace memplan::kernels {

void default_to_short_openmp_spin(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("GOMP_SPINCOUNT") != nullptr) return;
  if (setenv("GOMP_SPINCOUNT", std::to_string(kDefaultOpenMpSpinCount).c_str(), 0) != 0) return;
  execv("/proc/self/exe", argv);
  // Still here: the exec failed. This process's OpenMP runtime keeps its default.
}

}  // namespace memplan::kernels

namespace memplan::kernels {

std::string openmp_wait_policy() {
  if (const char* policy = std::getenv("OMP_WAIT_POLICY")) {
    std::string lower;
    for (const char* c = policy; *c != 0; ++c) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(*c)));
    return lower;
  }
  if (const char* spin = std::getenv("GOMP_SPINCOUNT")) return std::string("spincount ") + spin;
  return "default";
}

}  // namespace memplan::kernels
