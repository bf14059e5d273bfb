"""Triton's inference.GRPCInferenceService messages (package aaren.oip.v2).

Generated from grpc_service.proto and model_config.proto by proto/generate.py; do not edit.
"""
