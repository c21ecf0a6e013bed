"""Tools that watch or check the engine: anomaly mode, the profiler, gradcheck and the
reference executor. The engine reaches them only through narrow seams."""
