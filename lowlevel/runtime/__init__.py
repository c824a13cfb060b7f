"""Running a task: the graph, the session and its recovery, the training loop, hooks, the start and end-of-training protocols, faults, preemption, placement, evaluation."""
