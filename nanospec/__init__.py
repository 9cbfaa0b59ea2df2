"""NanoSpec: lossless tree speculative decoding with a per-request in-context draft vocabulary."""

from .config import METHODS, GenerationConfig, SamplingConfig, TreeConfig, VocabConfig
from .engine import Run, RunResult, SpecEngine
from .events import RunSummary, StepEvent, events_to_frame, load_trace, save_trace

__all__ = [
    "METHODS", "GenerationConfig", "SamplingConfig", "TreeConfig", "VocabConfig",
    "Run", "RunResult", "SpecEngine", "RunSummary", "StepEvent", "events_to_frame",
    "load_trace", "save_trace",
]
