// One training step as one static graph: forward (from a model) + backward + optimizer updates.
#pragma once

#include "memplan/graph/graph.h"
#include "memplan/graph/optimizer.h"

namespace memplan::graph {

// Turns a forward graph with `graph.loss` set into the full training step, in place.
void make_training_step(Graph& graph, const OptimizerConfig& optimizer);

}  // namespace memplan::graph
