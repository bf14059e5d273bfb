"""aaren_core: Aaren (attention as an RNN, Feng et al. 2024) with its baselines. Torch only."""

from aaren_core.attention import ScanState, attention_naive, attention_scan, attention_step
from aaren_core.attention.state import AarenState, GRUState, KVCacheState, State, StateFormatError
from aaren_core.nn.backbones import AarenModel, Backbone, BackboneConfig, GRUModel, TransformerModel, build_backbone

__all__ = [
    "AarenModel",
    "AarenState",
    "Backbone",
    "BackboneConfig",
    "GRUModel",
    "GRUState",
    "KVCacheState",
    "ScanState",
    "State",
    "StateFormatError",
    "TransformerModel",
    "attention_naive",
    "attention_scan",
    "attention_step",
    "build_backbone",
]
