"""Long-running streaming queries: checkpoints, micro-batch writers, progress, the runner."""
