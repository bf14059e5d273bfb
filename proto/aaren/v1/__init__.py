"""aaren.v1 wire contract: generated from aaren.proto by proto/generate.py; do not edit."""
