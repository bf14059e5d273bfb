"""The aaren gRPC service: settings, the engine core (batched model steps), session stores, front ends, metrics."""
