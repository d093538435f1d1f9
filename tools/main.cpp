// memplan: plan a training step's memory before it runs, then train inside that plan.
#include "memplan/kernels/openmp_wait.h"
#include "tools/cli_app.h"

int main(int argc, char** argv) {
  // Idle CPU threads sleep rather than spin unless the user chose (OMP_WAIT_POLICY): a step
  // sharing its cores with other processes slows down in proportion instead of collapsing.
  memplan::kernels::default_to_short_openmp_spin(argv);
  return memplan::tools::run_cli(argc, argv);
}
