"""Scientific steps on STMs: each a lazy ``Dataset -> Dataset`` function calling kernels per block."""
