// memplan: plan a training step's memory before it runs, then train inside that plan.
#include "tools/cli_app.h"

int main(int argc, char** argv) { return memplan::tools::run_cli(argc, argv); }
