"""How a step moves parameters and gradients: the exact mode (fused transfers, products on the ps) and the communication-reduced mode (local SGD, model averaging)."""
