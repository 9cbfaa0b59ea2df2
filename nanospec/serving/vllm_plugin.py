"""NanoSpec's per-request active vocabulary inside vLLM's EAGLE drafting (a `vllm.general_plugins` plugin).

vLLM calls `register()` in every process it starts (engine core, workers) before models load, through
the entry point `nanospec_active_vocab` in pyproject.toml (or call `install()` yourself before building
`vllm.LLM` when the engine core runs in your process). Nothing happens unless
`NANOSPEC_VLLM_ACTIVE_VOCAB=1`. When enabled it wraps, in vLLM 0.32:

- `GPUModelRunner.propose_draft_token_ids` (the CPU runner inherits it): hands the drafter each batch
  row's request id (`input_batch.req_ids`) and which rows vLLM discards (partial prefills), and frees the
  sets of requests that finished (`scheduler_output.finished_req_ids`);
- `GPUModelRunner._sample`: the target's top-k from the logits it computed this step (every verified
  position), so Ext needs no second LM-head product there; prompt positions (Ctx) use the LM head once;
- `SpecDecodeBaseProposer.propose`: before drafting, one pass over the whole batch adds to each
  request's set every scheduled target token (the prompt at prefill; the verified chain afterwards),
  the target's top-k at every scheduled position (from `_sample`'s logits, else the LM head applied to
  `target_hidden_states`; EAGLE-3 is handed other layers' states there, so its prompt positions add
  their tokens without the top-k) and the next token. Before that it records coverage: the share of the tokens
  the target emitted (accepted drafts, which came from the set, and its own next token) that were in
  the set the chain was drafted from;
- `SpecDecodeBaseProposer._greedy_sample`: the draft argmax over each request's active rows only, batched
  (one padded [B, W] id tensor, its LM-head rows gathered once per step, one bmm per drafted position);
- `SpecDecodeBaseProposer.__init__`: refuses a head whose hidden size or vocabulary differs from the
  target's before any weight loads.

An EAGLE-3 head drafts over the target's whole vocabulary here too (its own LM head, or the target's when
it has none); a head with a pruned draft vocabulary (`d2t`) is left unchanged.

vLLM's verification is untouched, so the output is vLLM's plain output; only acceptance can change.
Per request the plugin keeps steps, mean active size and coverage in `REPORT` (request id -> dict); with
`$NANOSPEC_VLLM_STATS` set, the process that drafts rewrites that file (JSON) after every draft step and
at exit (vLLM may end its worker processes without running exit handlers).
"""

from __future__ import annotations

import atexit
import functools
import inspect
import json
import logging
import os
import time
from pathlib import Path

import torch

from nanospec.serving.active_sets import ActiveSets, check_configs, topk_ids

ENV_ENABLE = "NANOSPEC_VLLM_ACTIVE_VOCAB"    # "1": wrap vLLM's drafting (otherwise register() does nothing)
ENV_CAPACITY = "NANOSPEC_VLLM_CAPACITY"      # ids kept per request (default: the engine's `capacity`)
ENV_CTX_TOPK = "NANOSPEC_VLLM_CTX_TOPK"      # target top-k per scheduled position (default: `ctx_topk`)
ENV_STATS = "NANOSPEC_VLLM_STATS"            # JSON file for REPORT, rewritten after every draft step
EAGLE_METHODS = ("eagle", "eagle3")  # vLLM's EAGLE-1/2 and EAGLE-3 drafting (full draft vocabulary)
FINAL_HIDDEN = ("eagle",)                    # methods whose proposer is handed the target's final hidden states

log = logging.getLogger("vllm.plugins.nanospec")  # under vLLM's logger: its handlers print it
REPORT: dict[str, dict] = {}                 # request id -> {"steps", "active_sum", "covered", "checked", ...}
TIMES: dict[str, float] = {"propose_s": 0.0, "propose_calls": 0, "sample_s": 0.0, "sample_calls": 0}
_installed: dict[str, object] = {}


def enabled(env: dict | None = None) -> bool:
    return (env if env is not None else os.environ).get(ENV_ENABLE, "0").strip().lower() in ("1", "true", "yes", "on")


def settings(env: dict | None = None) -> tuple[int, int]:
    """(capacity, ctx_topk) from the environment, defaulting to the engine's option table."""
    from nanospec.options import OPTIONS

    env = env if env is not None else os.environ
    out = []
    for name, var in (("capacity", ENV_CAPACITY), ("ctx_topk", ENV_CTX_TOPK)):
        raw = env.get(var)
        value = OPTIONS[name].default if raw in (None, "") else _int(var, raw)
        OPTIONS[name].check(value)
        out.append(value)
    return out[0], out[1]


def _int(var: str, raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"${var} must be an integer; got {raw!r}") from None


def register() -> None:
    """vLLM's `vllm.general_plugins` entry point: installs the wrappers when $NANOSPEC_VLLM_ACTIVE_VOCAB=1."""
    if enabled():
        install()


def install(capacity: int | None = None, ctx_topk: int | None = None) -> None:
    """Wrap vLLM's drafter and model runner (idempotent). Imports vLLM."""
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    cap, k = settings()
    _installed["capacity"] = capacity or cap
    _installed["ctx_topk"] = ctx_topk or k
    if _installed.get("done"):
        return
    _wrap(SpecDecodeBaseProposer, "__init__", _init)
    _wrap(SpecDecodeBaseProposer, "propose", _propose)
    _wrap(SpecDecodeBaseProposer, "_greedy_sample", _greedy_sample)
    _wrap(GPUModelRunner, "propose_draft_token_ids", _runner_propose)
    _wrap(GPUModelRunner, "_sample", _runner_sample)
    _installed["done"] = True
    if os.environ.get(ENV_STATS):
        atexit.register(_dump_if_drafted)
    log.info("NanoSpec active vocabulary on: capacity %d, ctx top-%d", _installed["capacity"], _installed["ctx_topk"])


def install_timers() -> None:
    """Time `propose` (a whole draft step) and `_greedy_sample` (LM head + argmax) into TIMES, with or
    without the active vocabulary (the benchmark uses it for both rows). Syncs CUDA around each call."""
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

    if _installed.get("timers"):
        return
    for name, key in (("propose", "propose"), ("_greedy_sample", "sample")):
        _wrap(SpecDecodeBaseProposer, name, _timed(key))
    _installed["timers"] = True


def _wrap(cls, name: str, make) -> None:
    original = getattr(cls, name)
    setattr(cls, name, functools.wraps(original)(make(original)))


def _timed(key: str):
    def make(original):
        def timed(self, *args, **kwargs):
            _sync()
            t = time.perf_counter()
            try:
                return original(self, *args, **kwargs)
            finally:
                _sync()
                TIMES[f"{key}_s"] += time.perf_counter() - t
                TIMES[f"{key}_calls"] += 1
        return timed
    return make


def _sync() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


# -- the wrappers -----------------------------------------------------------------------

def _init(original):
    def init(self, vllm_config, *args, **kwargs):
        spec = getattr(vllm_config, "speculative_config", None)
        if spec is not None and getattr(spec, "method", None) in EAGLE_METHODS and spec.draft_model_config is not None:
            target, head = vllm_config.model_config, spec.draft_model_config
            # before load_model: a mismatched head is refused before any weight loads
            check_configs(_dims(target.hf_config), _dims(head.hf_config), str(target.model), str(head.model))
        original(self, vllm_config, *args, **kwargs)
    return init


def _dims(hf_config) -> dict:
    """hidden size and vocabulary of a vLLM model config (an EAGLE head's sits in `.model`)."""
    inner = getattr(hf_config, "model", None)
    src = inner if hasattr(inner, "hidden_size") else hf_config
    text = src.get_text_config() if hasattr(src, "get_text_config") else src
    return {key: getattr(text, key, None) for key in ("hidden_size", "vocab_size", "target_hidden_size")}


def _runner_propose(original):
    def propose_draft_token_ids(self, scheduler_output, *args, **kwargs):
        state = _state(getattr(self, "drafter", None), create=True)  # the first step's prefill is Ctx too
        if state is None:
            return original(self, scheduler_output, *args, **kwargs)
        for req in getattr(scheduler_output, "finished_req_ids", ()) or ():
            state.finish(req)
        n = self.input_batch.num_reqs
        state.batch = list(self.input_batch.req_ids[:n])
        mask = getattr(self, "discard_request_mask", None)
        state.discard = [bool(x) for x in mask.np[:n]] if mask is not None else [False] * n
        # tokens the target emitted this step per row (accepted drafts + its own): -1 marks rejected slots
        # in the padded batch's tensor; without padding vLLM passes one host list per row
        sampled = args[0] if args else kwargs.get("sampled_token_ids")
        if torch.is_tensor(sampled):
            state.emitted = (sampled[:n] >= 0).sum(1)
        else:
            state.emitted = torch.tensor([len(x) for x in (sampled or [])][:n] or [0] * n)
        try:
            return original(self, scheduler_output, *args, **kwargs)
        finally:
            state.batch, state.emitted = None, None
    return propose_draft_token_ids


def _runner_sample(original):
    def sample(self, logits, spec_decode_metadata, *args, **kwargs):
        state = _state(getattr(self, "drafter", None), create=True)
        if state is not None and logits is not None:
            # the target's top-k where it computed logits this step (every verified position), before the
            # sampler touches them: Ext then needs no second LM-head product at those positions
            drafts = list(spec_decode_metadata.num_draft_tokens) if spec_decode_metadata is not None else None
            state.stash = (logits[:, : state.sets.vocab_size].topk(state.ctx_topk, dim=-1).indices, drafts)
        return original(self, logits, spec_decode_metadata, *args, **kwargs)
    return sample


def _propose(original):
    signature = inspect.signature(original)

    def propose(self, *args, **kwargs):
        state = _state(self, create=True)
        if state is None or state.batch is None:
            return original(self, *args, **kwargs)
        bound = signature.bind(self, *args, **kwargs).arguments
        state.padded = not getattr(self.speculative_config, "disable_padded_drafter_batch", False)
        state.begin_step(self, bound["target_token_ids"], bound["target_hidden_states"], bound["next_token_ids"],
                         bound["common_attn_metadata"])
        try:
            return original(self, *args, **kwargs)
        finally:
            state.end_step()
    return propose


def _greedy_sample(original):
    def greedy_sample(self, hidden_states):
        state = _state(self)
        if state is None or state.rows is None or hidden_states.shape[0] != state.rows.shape[0]:
            return original(self, hidden_states)
        return state.draft_argmax(hidden_states)
    return greedy_sample


def _state(proposer, create: bool = False) -> "ProposerVocab | None":
    """The proposer's NanoSpec state (made on first use, once the LM head is loaded); None where the
    plugin does not apply (another method, a pruned draft vocabulary, not installed)."""
    if proposer is None or not _installed.get("done"):
        return None
    state = getattr(proposer, "_nanospec_vocab", None)
    if state is not None or not create:
        return state if isinstance(state, ProposerVocab) else None
    if getattr(proposer, "method", None) not in EAGLE_METHODS or getattr(proposer, "use_heterogeneous_vocab", False) \
            or getattr(proposer, "use_local_argmax_reduction", False):
        proposer._nanospec_vocab = False  # never applies to this proposer
        log.warning("NanoSpec active vocabulary: method %r not supported (EAGLE-1/2/3 over the full vocabulary "
                    "only); drafting unchanged",
                    getattr(proposer, "method", None))
        return None
    weight = proposer.model.lm_head.weight  # the head's LM head (EAGLE-1/2 and a head without one: the target's)
    vocab = proposer.vllm_config.model_config.get_vocab_size()
    state = ProposerVocab(weight[:vocab], int(_installed["capacity"]), int(_installed["ctx_topk"]),
                       final_hidden=proposer.method in FINAL_HIDDEN)
    proposer._nanospec_vocab = state
    return state


# -- per-proposer state ---------------------------------------------------------------------

class ProposerVocab:
    """The sets of every live request of one drafter, and the step being drafted."""

    def __init__(self, weight: torch.Tensor, capacity: int, ctx_topk: int, final_hidden: bool = True):
        self.weight = weight  # [V, H] the draft LM head (EAGLE-1/2: the target's)
        # whether propose's `target_hidden_states` are the target's final ones (EAGLE-1/2), so that the LM head
        # applied to them gives the target's top-k where vLLM computed no logits; EAGLE-3's are other layers'
        self.final_hidden = final_hidden
        self.ctx_topk = ctx_topk
        self.sets = ActiveSets(weight.shape[0], capacity, weight.device)
        self.batch: list[str] | None = None  # request id per batch row, set by the runner wrapper
        self.discard: list[bool] = []
        self.rows: torch.Tensor | None = None  # [B] pool rows of this step (None outside propose)
        self._drafted: set[str] = set()  # requests that had a chain drafted from their set
        self._cache = None  # (safe, ok, rows_w) of this step: the sets do not change within a chain
        self.stash = None  # (top-k [M, k], drafts per row or None) from the target's logits this step
        self.emitted: torch.Tensor | None = None  # [B] tokens the target emitted per row this step
        self.padded = True  # vLLM's padded drafter batch: propose's tokens are the step's scheduled tokens

    def begin_step(self, proposer, token_ids, hidden, next_ids, attn_meta) -> None:
        """Coverage of the next tokens, then Ctx/Ext for every row at once."""
        batch = self.batch
        b = len(batch)
        pool = self.sets.rows_for(batch)
        rows = torch.tensor(pool, dtype=torch.long, device=self.sets.device)
        nxt = next_ids[:b].to(self.sets.device, torch.long)
        covered = self.sets.contains(rows, nxt)  # the set each chain was drafted from: not updated yet
        # every scheduled token and the target's top-k there, each tagged with its batch row
        qsl = attn_meta.query_start_loc_cpu[: b + 1].to(torch.long)
        n_tok = int(qsl[-1])
        counts = (qsl[1:] - qsl[:-1]).to(self.sets.device)
        tok_rows = torch.repeat_interleave(rows, counts, output_size=n_tok)  # [N]
        tokens = token_ids[:n_tok].to(self.sets.device, torch.long)
        top = self._scheduled_topk(qsl, hidden[:n_tok], tokens)  # [N, k]
        cand = torch.cat([tokens.unsqueeze(1), top], 1).reshape(-1)
        cand_rows = tok_rows.repeat_interleave(1 + self.ctx_topk)
        self.sets.add(torch.cat([cand_rows, rows]), torch.cat([cand, nxt]))
        # one host read per step: active sizes and coverage for the report, and the gather width
        emitted = self.emitted.to(self.sets.device, torch.long) if self.emitted is not None else torch.ones_like(rows)
        sizes, cov, emitted = torch.stack([self.sets.count[rows], covered.long(), emitted]).tolist()
        for i, req in enumerate(batch):
            stat = REPORT.setdefault(req, {"steps": 0, "active_sum": 0, "active_max": 0, "covered": 0,
                                          "checked": 0, "next_covered": 0, "next_checked": 0,
                                          "capacity": self.sets.capacity})
            stat["steps"] += 1
            stat["active_sum"] += sizes[i]
            stat["active_max"] = max(stat["active_max"], sizes[i])
            if req in self._drafted and not self.discard[i] and emitted[i] > 0:
                # emitted = accepted drafts (drafted from the set, so in it) + the target's own next token
                stat["checked"] += emitted[i]
                stat["covered"] += emitted[i] - 1 + cov[i]
                stat["next_checked"] += 1
                stat["next_covered"] += cov[i]
            if not self.discard[i]:
                self._drafted.add(req)
        if os.environ.get(ENV_STATS):  # vLLM may kill its workers without running atexit: keep the file current
            _dump_if_drafted()
        self.rows = rows
        self._width = max(sizes) if sizes else 1
        self._cache = None

    def _scheduled_topk(self, qsl: torch.Tensor, hidden: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """The target's top-k at every scheduled position: taken from its own logits where it computed them
        (the last drafts + 1 positions of each row), the LM head applied to the hidden states elsewhere
        (prompt positions; without final hidden states, EAGLE-3, the position's own token k times, which adds
        nothing new). Index arithmetic on the host, from host data (no device read)."""
        stash, self.stash = self.stash, None
        n_tok, b = hidden.shape[0], qsl.shape[0] - 1

        def elsewhere(at=None):
            if not self.final_hidden:
                return (tokens if at is None else tokens[at]).unsqueeze(1).expand(-1, self.ctx_topk)
            return topk_ids(hidden if at is None else hidden[at], self.weight, self.ctx_topk)

        if stash is None or not self.padded:
            return elsewhere()
        top_l, drafts = stash
        have = torch.tensor(drafts, dtype=torch.long) + 1 if drafts is not None else torch.ones(b, dtype=torch.long)
        counts = qsl[1:] - qsl[:-1]
        if have.shape[0] != b or top_l.shape[0] != int(have.sum()) or bool((have > counts).any()):
            return elsewhere()  # not the layout this was written for
        # token index of each logits row: the last `have[i]` tokens of row i
        within = torch.arange(int(have.sum())) - torch.repeat_interleave(torch.cumsum(have, 0) - have, have)
        with_logits = torch.repeat_interleave(qsl[1:] - have, have) + within
        missing = torch.ones(n_tok, dtype=torch.bool)
        missing[with_logits] = False
        missing = missing.nonzero().squeeze(1)  # host tensors: no device sync
        dev = self.sets.device
        top = torch.empty((n_tok, self.ctx_topk), dtype=torch.long, device=dev)
        top[with_logits.to(dev)] = top_l.to(dev, torch.long)
        if missing.numel():
            missing = missing.to(dev)
            top[missing] = elsewhere(missing)
        return top

    def draft_argmax(self, h: torch.Tensor) -> torch.Tensor:
        if self._cache is None:  # first drafted position of the step: gather each row's active LM-head rows
            self._cache = self.sets.gather(self.rows, self.weight, self._width)
        return ActiveSets.argmax_over(h, *self._cache)

    def end_step(self) -> None:
        self.rows, self._cache = None, None

    def finish(self, req_id: str) -> None:
        self.sets.free(req_id)
        self._drafted.discard(req_id)
        if req_id in REPORT:
            REPORT[req_id]["finished"] = True


def summary(report: dict[str, dict] | None = None) -> dict:
    """Per request: steps, mean active size, coverage; and the means over requests."""
    report = REPORT if report is None else report
    per = {}
    for req, s in report.items():
        per[req] = {"steps": s["steps"], "mean_active": s["active_sum"] / s["steps"] if s["steps"] else None,
                    "max_active": s["active_max"], "capacity": s["capacity"],
                    "coverage": s["covered"] / s["checked"] if s["checked"] else None, "checked": s["checked"],
                    "next_coverage": s["next_covered"] / s["next_checked"] if s["next_checked"] else None}
    act = [p["mean_active"] for p in per.values() if p["mean_active"] is not None]
    cov_n = sum(s["checked"] for s in report.values())
    next_n = sum(s["next_checked"] for s in report.values())
    return {"requests": per, "mean_active": sum(act) / len(act) if act else None,
            "coverage": sum(s["covered"] for s in report.values()) / cov_n if cov_n else None,
            "next_coverage": sum(s["next_covered"] for s in report.values()) / next_n if next_n else None}


def dump_report(path: str | Path) -> None:
    """Write the summary and timers as JSON (atomically: a reader never sees half a file)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"summary": summary(), "times": TIMES}, indent=2))
    os.replace(tmp, path)


def _dump_if_drafted() -> None:
    """$NANOSPEC_VLLM_STATS from the process that drafts (vLLM's other processes load the plugin too)."""
    path = os.environ.get(ENV_STATS)
    if path and REPORT:
        dump_report(path)
