"""The aaren gRPC service: settings, runtime (batched model steps), session stores, servicer, metrics."""
