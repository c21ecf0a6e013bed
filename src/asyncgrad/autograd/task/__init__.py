"""One backward call's state and the steps of running it: the GraphTask (dependencies, ready
queue, the router, staging and ownership of leaf gradients), input buffers, pruning, the node
sequence (step.py), the commit and the lifecycle around it. Knows the graph, not the loop."""
