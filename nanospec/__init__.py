"""NanoSpec: lossless tree speculative decoding with a per-request in-context draft vocabulary.

The public API is what this package exports (below) plus these documented submodules:
`nanospec.config` (the configs), `nanospec.options` (every run option declared once, and
`run_defaults(device)`: what a run gets when the caller sets nothing), `nanospec.metrics` (τ, coverage, speedup, identical-to-ar and
token origins, each defined once), `nanospec.events` (step events, summaries, the trace format),
`nanospec.timing` (phase names), `nanospec.pair` (`load_pair`: target + head + frequency table),
`nanospec.paths` (`ASSETS`), `nanospec.presets` (pair presets: `load_presets`, `get_preset`),
`nanospec.hub` (hub folders through one replaceable download function), `nanospec.data.prompts`
(the prompt set and prompt files), `nanospec.precision` (exactness at low precision: first divergence
and the target's margin there), `nanospec.lesson.record` (the recorded lesson's file names, format and command),
`nanospec.lesson.fingerprint` (whether a recording was made by this engine),
`nanospec.bench.trust` (whether timings can be trusted: one judgement for the lesson, `compare` and the app),
`nanospec.decoding.cost_curve` (the draft budget's `CostCurve`, as `SpecEngine.cost_curve()` returns it),
`nanospec.bench.peers` (outside engines, vLLM, run in a child process on the same prompts), and, for
tests and development only, `nanospec.bench.random_pair` (random-weight models). Anything else,
and any name starting with `_`, may change without notice.
"""

from nanospec import metrics
from nanospec.config import METHODS, GenerationConfig, SamplingConfig, TreeConfig, VocabConfig
from nanospec.decoding.engine import SpecEngine
from nanospec.events import STOP_REASONS, RunSummary, StepEvent, events_to_frame, load_trace, save_trace, stop_message, summarize
from nanospec.decoding.run import Run, RunResult

__all__ = [
    "METHODS", "GenerationConfig", "SamplingConfig", "TreeConfig", "VocabConfig",
    "Run", "RunResult", "SpecEngine", "RunSummary", "StepEvent", "events_to_frame",
    "load_trace", "save_trace", "metrics", "STOP_REASONS", "stop_message", "summarize",
]
