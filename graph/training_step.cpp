#include "memplan/graph/training_step.h"

#include "memplan/graph/autograd.h"

namespace memplan::graph {

void make_training_step(Graph& graph, const OptimizerConfig& optimizer) {
  if (graph.loss == kNoTensor) throw GraphError("the model graph has no loss to train on");
  append_backward(graph, graph.loss);
  append_optimizer(graph, optimizer);
}

}  // namespace memplan::graph
