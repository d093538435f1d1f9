// How idle OpenMP threads wait between the CPU kernels' parallel regions. GCC's libgomp spins by
// default, which collapses a multi-threaded step when other processes share the cores (a
// spinning thread holds a core the thread it waits for needs). libgomp reads OMP_WAIT_POLICY
// once, when it is loaded (before main, and glibc restores the environment after any earlier
// hook), so a program changes its default only by starting again with the variable set.
#pragma once

#include <string>

namespace memplan::kernels {

// Call first thing in main(argc, argv). When neither OMP_WAIT_POLICY nor GOMP_SPINCOUNT is set
// (a user's explicit choice always wins), sets OMP_WAIT_POLICY=passive and re-executes the
// program (/proc/self/exe, same arguments), so idle threads sleep. Returns when it did not
// re-execute: the variable was set already, or the exec failed (then the run goes on spinning).
void default_to_passive_openmp_wait(char** argv);

// What this process's OpenMP runtime was started with, for reports: "passive", "active" (the
// value of OMP_WAIT_POLICY), "spincount N" (GOMP_SPINCOUNT), or "default" (libgomp spins a while).
std::string openmp_wait_policy();

}  // namespace memplan::kernels
