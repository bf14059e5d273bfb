"""The Open Inference Protocol (KServe v2) with Triton's extensions, as Triton defines it."""
