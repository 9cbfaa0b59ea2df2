"""The decoding loop: prefill, one speculative (or autoregressive) step, streaming and blocking APIs.

    prompt -> prefill -> [draft tree -> verify -> accept -> compact KV -> update vocab/head]* -> text

`SpecEngine.stream()` returns a `Run` (`run.py`), an iterator of `StepEvent`s (one per target
forward); `generate()` drains it. Both go through the same `_prefill` / `_spec_step` / `_ar_step`;
acceptance and the step events are in `bookkeeping.py`.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import weakref
from collections.abc import Callable, Generator
from dataclasses import dataclass

import torch

from nanospec.config import TREE_OPTIONS, GenerationConfig
from nanospec.options import run_defaults
from nanospec.decoding.bookkeeping import accept_step, single_node_event, spec_event
from nanospec.decoding.budget import CostCurve, DraftBudget, load_or_measure
from nanospec.decoding.copy_branch import PAD, CopyBranch
from nanospec.loaders.cpu_linear import PackedLinear, kernel_summary
from nanospec.loaders.fused_norm import fuse_rms_norms
from nanospec.loaders.cpu_linear import pack_linears as pack_modules
from nanospec.drafters.base import Drafter
from nanospec.heads.draft_vocab import DraftVocab, needs_mapping
from nanospec.drafters.eagle import EagleDrafter
from nanospec.drafters.eagle3 import Eagle3Drafter
from nanospec.events import StepEvent
from nanospec.heads.features import FeatureRecorder
from nanospec.heads.head import EagleHead, check_head_matches, check_head_placement
from nanospec.heads.head3 import Eagle3Head, check_eagle3_head
from nanospec.decoding.attention import use_tree_attention
from nanospec.decoding.kv import compact_cache, new_cache
from nanospec.decoding.run import Run, RunResult
from nanospec.timing import PhaseTimer, sync
from nanospec.decoding.tree import keep_nodes, tree_attention_mask, tree_position_ids
from nanospec.decoding import transfer
from nanospec.decoding.accept import sample_token
from nanospec.decoding.verify import check_attention_supported, greedy_token, target_forward, warp_probs
from nanospec.vocab import VocabPolicy, build_vocab

logger = logging.getLogger(__name__)

PREFILL_CHUNK = 512  # positions per LM-head chunk when collecting Ctx top-k at prefill


@dataclass
class _State:
    cache: object
    length: int          # entries in the target's KV cache
    root: int            # last emitted token, not yet in the cache
    root_dev: torch.Tensor  # [1] long, the same token on the device (drafting never waits for the host)
    emitted: int
    generator: torch.Generator | None
    copy: CopyBranch | None = None  # the context-copy branch (cfg.tree.copy_branch > 0)
    budget: DraftBudget | None = None  # the cost-aware draft budget (cfg.tree.budget)


StepHook = Callable[[int, str], None]


class SpecEngine:
    """A target model, optionally a draft head, and the per-policy vocabularies (made lazily).

    `before_step(step, method)`, when set (constructor or attribute), is called on the decoding
    thread before every decoding step after prefill (step 1, 2, ...; `method` is the run's),
    speculative and autoregressive alike: the place to count steps, slow them down or raise to
    abort a run, without touching the engine's internals. `timing=False` turns the per-phase
    timer off (StepEvent.phases are then zeros; on CUDA that saves its one event read per step).
    """

    def __init__(self, model, tokenizer=None, head: EagleHead | None = None, *,
                 frequent_ids: torch.Tensor | None = None, drafter_factory: Callable[[], Drafter] | None = None,
                 eos_token_ids: list[int] | None = None, pack_linears: bool = True,
                 before_step: StepHook | None = None, timing: bool = True):
        check_attention_supported(model.config)
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.head = head
        # EAGLE-3 reads three target states (features.py): hooks keep only those, on every target call
        self._features: FeatureRecorder | None = None
        if isinstance(head, Eagle3Head):
            check_eagle3_head(head, model.config)
            self._features = FeatureRecorder(model).attach()
            weakref.finalize(self, self._features.detach)      # the hooks go with the engine
        if head is not None:
            if not isinstance(head, Eagle3Head):
                check_head_matches(head.config, model.config)
            check_head_placement(head, model)
        # fp32 on CPU: pre-pack every linear weight for oneDNN, in place (cpu_linear.py); the
        # target, the head and the full/static drafter LM heads all get it, so no method gains
        # from a kernel another lacks. Elsewhere (CUDA, half precision) nothing changes.
        self.packed_linears = self.fused_norms = 0
        if pack_linears:
            self.packed_linears = pack_modules(model) + (pack_modules(head) if head is not None else 0)
            # RMS norms on the fused kernel where it gives the same numbers bit for bit (fused_norm.py)
            self.fused_norms = fuse_rms_norms(model) + (fuse_rms_norms(head) if head is not None else 0)
        self.device = next(model.parameters()).device
        if self.device.type == "cpu":  # grouped heads without copying the cache under a tree mask (attention.py)
            use_tree_attention(model.config)
            if head is not None and hasattr(head, "config"):
                use_tree_attention(head.config)
        self.kernels = (f"{kernel_summary(self.packed_linears, self.device)}; {self.fused_norms} fused RMS norms; "
                        f"attention: {getattr(model.config, '_attn_implementation', '?')}")
        logger.info("decoding on %s: %s", self.device, self.kernels)  # which path, said once per engine
        self.lm_head_weight = model.get_output_embeddings().weight  # [V, H]
        self.vocab_size = self.lm_head_weight.shape[0]
        self.frequent_ids = frequent_ids
        self.max_context = int(getattr(model.config, "max_position_embeddings", 1 << 30))
        self.drafter_factory = drafter_factory  # None: an EagleDrafter over `head`
        self.before_step = before_step
        self.timing = timing  # per-phase times in each StepEvent (on CUDA: one event read per step)
        self._vocabs: dict[tuple, object] = {}
        self._cost_curve: CostCurve | None = None
        self._budgets: dict[str, DraftBudget] = {}  # per method: the last request's draft budget
        if eos_token_ids is None:
            eos_token_ids = _eos_ids(model, tokenizer)
        self.eos_token_ids = set(eos_token_ids)

    # -- public API ------------------------------------------------------------------
    def encode(self, prompt: str | list[dict], chat: bool | None = None) -> list[int]:
        """Text or chat turns -> ids; the chat template is applied when the tokenizer has one."""
        if isinstance(prompt, str):
            if not prompt.strip():
                raise ValueError("prompt must be a non-empty string")
            messages = [{"role": "user", "content": prompt}]
        elif isinstance(prompt, list) and prompt and all(isinstance(m, dict) and "content" in m for m in prompt):
            messages = prompt
            if not any(str(m["content"]).strip() for m in messages):
                raise ValueError("prompt must contain at least one non-empty turn")
        else:
            raise ValueError("prompt must be a non-empty string or a list of {'role', 'content'} turns")
        if self.tokenizer is None:
            raise ValueError("this engine has no tokenizer: pass token ids to stream()/generate()")
        use_chat = chat if chat is not None else bool(getattr(self.tokenizer, "chat_template", None))
        if use_chat:
            ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            if hasattr(ids, "keys"):
                ids = ids["input_ids"]
            return list(ids)
        if not isinstance(prompt, str):
            raise ValueError("chat turns need a tokenizer with a chat template")
        return self.tokenizer(prompt)["input_ids"]

    def encode_prompt(self, prompt: str | list[dict] | list[int] | torch.Tensor) -> list[int]:
        """Whatever `stream()` accepts as a prompt -> token ids (ids are range-checked, text encoded)."""
        if isinstance(prompt, (list, tuple)) and prompt and all(isinstance(x, int) for x in prompt):
            ids = [int(x) for x in prompt]
            if any(not 0 <= x < self.vocab_size for x in ids):
                raise ValueError(f"prompt token ids must be in [0, {self.vocab_size})")
            return ids
        if isinstance(prompt, torch.Tensor):
            return self.encode_prompt(transfer.to_host(prompt.reshape(-1))[0])
        return self.encode(prompt)

    def stream(self, prompt: str | list[dict] | list[int], config: GenerationConfig | None = None,
               **options) -> Run:
        """Validate everything, then return a `Run` that decodes lazily as it is iterated.

        Keyword options that set no tree option (`depth`, `top_k`, `total_tokens`, `copy_branch`,
        `copy_ngram`) start from the device's run defaults (`options.run_defaults`, which give
        `config.default_tree`); a `GenerationConfig` is used exactly as given."""
        if config is not None and options:
            raise ValueError("pass either a GenerationConfig or keyword options, not both")
        if config is None and not TREE_OPTIONS & options.keys():
            options = {**run_defaults(self.device), **options}
        cfg = config or GenerationConfig.build(options.pop("method", "nanospec"), **options)
        cfg.validate()
        missing = self.missing_for(cfg.method)
        if missing:
            raise ValueError(missing)
        if cfg.method != "ar" and cfg.tree.budget:
            self.cost_curve(cfg.tree.max_nodes)  # measured before the run, so never inside its timing
        ids = self.encode_prompt(prompt)
        need = len(ids) + cfg.step_slots + 1
        if need > self.max_context:
            raise ValueError(f"prompt is {len(ids)} tokens; with the tree it must fit the model's context of "
                             f"{self.max_context} tokens (at most {self.max_context - cfg.step_slots - 1})")
        return Run(self, ids, cfg)

    def missing_for(self, method: str) -> str | None:
        """Why this engine cannot run `method` (it lacks a draft head or a frequency table), or None."""
        if method != "ar" and self.head is None and self.drafter_factory is None:
            return f"method {method!r} needs a draft head; only 'ar' runs without one"
        if method in ("static", "hybrid") and self.frequent_ids is None:
            return f"method {method!r} needs a token-frequency table (frequent_ids)"
        return None

    def generate(self, prompt, config: GenerationConfig | None = None, **options) -> RunResult:
        return self.stream(prompt, config, **options).result()

    def cost_curve(self, max_nodes: int = 0) -> CostCurve:
        """The target's forward cost against verified tokens on this device, for the draft budget:
        read from the cache when it matches this pair and device, else measured (a few seconds)."""
        curve = self._cost_curve
        if curve is None or max(curve.sizes) < max_nodes:
            curve = self._cost_curve = load_or_measure(self.model, self.device, self.packed_linears > 0, max_nodes)
        return curve

    def use_cost_curve(self, curve: CostCurve | None) -> None:
        """Set the budget's cost curve (measured elsewhere, or made up to force a budget in a test);
        None measures (or reads the cache) again on the next budgeted run. Either way the acceptance
        statistics carried between requests start afresh."""
        self._cost_curve = curve
        self._budgets.clear()

    # -- the loop --------------------------------------------------------------------
    def decode(self, prompt_ids: list[int], cfg: GenerationConfig) -> Generator[StepEvent, None, str]:
        """The decoding loop over validated input (what a `Run` iterates): yields one event per
        target forward and returns why it stopped (events.STOP_REASONS, less "stopped")."""
        spec = cfg.method != "ar"
        vocab = self._vocab(cfg) if spec else None
        drafter = self._new_drafter() if spec else None
        timer = PhaseTimer(self.device, enabled=self.timing)
        state, event = self._prefill(prompt_ids, cfg, vocab, drafter, timer)
        yield event
        step = 1
        while True:
            reason = self._stop_reason(state, cfg, event)
            if reason:
                return reason
            if self.before_step is not None:
                self.before_step(step, cfg.method)
            if spec:
                event = self._spec_step(step, state, cfg, vocab, drafter, timer)
            else:
                event = self._ar_step(step, state, cfg, timer)
            yield event
            step += 1

    def _stop_reason(self, state: _State, cfg: GenerationConfig, event: StepEvent) -> str | None:
        if cfg.stop_on_eos and event.tokens and event.tokens[-1] in self.eos_token_ids:
            return "eos"
        if state.emitted >= cfg.max_new_tokens:
            return "max_new_tokens"
        if state.length + cfg.step_slots + 1 > self.max_context:
            return "context_limit"  # the next step's tree would not fit; see events.stop_message
        return None

    @torch.inference_mode()
    def _prefill(self, prompt_ids, cfg, vocab, drafter, timer) -> tuple[_State, StepEvent]:
        t0 = time.perf_counter()
        ids = torch.tensor([prompt_ids], device=self.device)                # [1, n]
        n = ids.shape[1]
        cache = new_cache()
        gen = None
        if not cfg.sampling.greedy:
            gen = torch.Generator(device=self.device)
            gen.manual_seed(cfg.sampling.seed if cfg.sampling.seed is not None else torch.seed())
        with timer.phase("verify_forward"):
            hidden = self._target_hidden(ids, cache)                       # [n, H]
            first_dev = self._choose(self._lm_head(hidden[-1:]), cfg, gen)  # [1]
        (first,), = transfer.to_host(first_dev)
        added = 0
        if vocab is not None:
            with timer.phase("vocab_update"):
                top = self._prefill_topk(hidden, cfg.vocab.ctx_topk)       # [n, k]
                # the first token too: sampling may draw it from outside the prompt's top-k
                added = vocab.begin_request(ids[0], torch.cat([top.reshape(-1), first_dev]))
            with timer.phase("draft_layers"):
                drafter.begin(ids[0], self._draft_features(hidden), first)
        state = _State(cache, n, first, first_dev, 0, gen)
        if vocab is not None and cfg.tree.copy_branch:
            state.copy = CopyBranch(cfg.tree.copy_branch, cfg.tree.copy_ngram, self.device)
            state.copy.begin(ids[0], first)
        if vocab is not None and cfg.tree.budget:
            state.budget = DraftBudget(self.cost_curve(cfg.tree.max_nodes), cfg.tree.depth + cfg.tree.copy_branch,
                                       self.device, earlier=self._budgets.get(cfg.method),
                                       max_nodes=cfg.tree.max_nodes)
            self._budgets[cfg.method] = state.budget  # the next request of this method starts from its statistics
        tokens = self._take([first], state, cfg)
        phases = timer.resolve()
        sync(self.device)
        event = single_node_event(0, cfg.method, int(prompt_ids[-1]), first, tokens,
                                  vocab.size if vocab is not None else 0, added, self.vocab_size, t0, phases,
                                  tree_sources=["root"])
        return state, event

    @torch.inference_mode()
    def _spec_step(self, step: int, state: _State, cfg: GenerationConfig, vocab: VocabPolicy,
                   drafter: Drafter, timer: PhaseTimer) -> StepEvent:
        t0 = time.perf_counter()
        active_size = vocab.size
        budget = state.budget
        fixed = cfg.tree.fixed_shape or self.device.type != "cpu"  # a shape that never depends on data
        if hasattr(drafter, "keep_drafting"):
            # a CPU may read the host: stop drafting deeper once no frontier node could pay
            drafter.keep_drafting = None if budget is None or fixed else budget.keep_drafting
        tree = drafter.draft(state.root_dev, vocab, cfg.tree, timer)
        if state.copy is not None:
            tree = state.copy.extend(tree, vocab, timer, cfg.tree.fixed_shape)
        drafted, extra = len(tree), ()
        if budget is not None:
            with timer.phase("budget"):
                keep, expected = budget.select(tree)
                extra = (expected,)
                if fixed:  # the count of drafted nodes (PAD slots excluded) comes with the step's one read
                    if tree.sources is not None:
                        extra += ((tree.sources != PAD).sum(),)
                    tree = dataclasses.replace(tree, enabled=keep)
                else:
                    tree = keep_nodes(tree, keep)
        L = state.length
        with timer.phase("verify_forward"):
            # a lone root sees the whole prefix: the causal default, as in an `ar` step
            mask = tree_attention_mask(tree.ancestors, L) if len(tree) > 1 else None  # [1, 1, T, L + T]
            pos = tree_position_ids(tree.depths, L)                         # [1, T]
            out = target_forward(self.model, tree.tokens[None], pos, state.cache, mask)
        with timer.phase("vocab_update"):
            # Ext candidates: every tree token + the target's top-k and argmax at every node (the
            # argmax is top-k's first column unless tied logits make them differ); accept_step adds
            # the bonus token
            argmax = greedy_token(out.logits)                                # [T]
            top = torch.topk(out.logits, cfg.vocab.ctx_topk, dim=-1).indices  # [T, k]
            candidates = torch.cat([tree.tokens, top.reshape(-1), argmax])
        with timer.phase("accept"):
            acc = accept_step(tree, out.logits, argmax, candidates, vocab, cfg.sampling, state.generator, extra)
        path, bonus, host, keep = acc.path, acc.bonus, acc.tree, acc.keep
        if budget is not None:
            with timer.phase("budget"):
                on_path = torch.zeros(len(tree), dtype=torch.bool, device=self.device).index_fill_(0, keep, True)
                enabled = tree.enabled if tree.enabled is not None else torch.ones_like(on_path)
                budget.learn(tree, enabled, on_path)
        if len(tree) > 1:  # a lone root's entry is already where it belongs
            with timer.phase("kv_compact"):
                compact_cache(state.cache, L, keep)
        with timer.phase("vocab_update"):
            added = vocab.commit(acc.proposal, acc.n_new)
        next_tokens = torch.cat([tree.tokens[keep[1:]], acc.bonus_dev])
        drafter.update(self._draft_features(out.hidden)[keep], next_tokens, timer)
        if state.copy is not None:
            state.copy.append(next_tokens)
        state.length = L + len(path)
        state.root, state.root_dev = bonus, acc.bonus_dev
        accepted = [host.tokens[i] for i in path[1:]]
        tokens = self._take(accepted + [bonus], state, cfg)
        phases = timer.resolve()
        event = spec_event(step, cfg.method, acc, accepted, tokens, active_size, added, self.vocab_size, t0, phases)
        if budget is not None:
            event.drafted_nodes = acc.extra[1] if len(acc.extra) > 1 else drafted
            event.expected_tokens = round(acc.extra[0], 4)
            event.budget_threshold = round(budget.threshold, 6)
            budget.observe(len(accepted) + 1, event.wall_ms, len(event.tree_tokens))
        return event

    @torch.inference_mode()
    def _ar_step(self, step: int, state: _State, cfg: GenerationConfig, timer: PhaseTimer) -> StepEvent:
        t0 = time.perf_counter()
        with timer.phase("verify_forward"):
            pos = torch.full((1, 1), state.length, device=self.device)
            out = target_forward(self.model, state.root_dev[None], pos, state.cache)
        with timer.phase("accept"):
            token_dev = self._choose(out.logits, cfg, state.generator)      # [1]
            (token,), = transfer.to_host(token_dev)
        root = state.root
        state.length += 1
        state.root, state.root_dev = token, token_dev
        tokens = self._take([token], state, cfg)
        phases = timer.resolve()
        return single_node_event(step, "ar", root, token, tokens, 0, 0, self.vocab_size, t0, phases)

    # -- helpers ---------------------------------------------------------------------
    def _take(self, tokens: list[int], state: _State, cfg: GenerationConfig) -> list[int]:
        """Cut a step's tokens at the first EOS and at the max_new_tokens budget."""
        out = []
        for tok in tokens:
            if state.emitted >= cfg.max_new_tokens:
                break
            out.append(tok)
            state.emitted += 1
            if cfg.stop_on_eos and tok in self.eos_token_ids:
                break
        return out

    def _choose(self, logits: torch.Tensor, cfg: GenerationConfig, gen) -> torch.Tensor:
        """[q, V] logits -> [q] tokens on the device: argmax, or a draw from the warped distribution."""
        if cfg.sampling.greedy:
            return greedy_token(logits)
        probs = warp_probs(logits, cfg.sampling.temperature, cfg.sampling.top_p)
        return sample_token(probs, torch.rand(probs.shape[0], generator=gen, device=probs.device))

    def _target_hidden(self, ids: torch.Tensor, cache) -> torch.Tensor:
        pos = torch.arange(ids.shape[1], device=self.device)[None]
        return target_forward(self.model, ids, pos, cache, with_logits=False).hidden

    def _lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.get_output_embeddings()(hidden).float()

    def _prefill_topk(self, hidden: torch.Tensor, k: int) -> torch.Tensor:
        parts = [torch.topk(self._lm_head(hidden[i:i + PREFILL_CHUNK]), k, dim=-1).indices
                 for i in range(0, hidden.shape[0], PREFILL_CHUNK)]
        return torch.cat(parts)

    def _vocab(self, cfg: GenerationConfig):
        v = cfg.vocab
        key = (cfg.method, v.capacity, v.static_size, v.core_size)
        if key not in self._vocabs:
            # EAGLE-3 heads score their own lm_head rows (draft ids); others the target's LM head
            eagle3 = isinstance(self.head, Eagle3Head)
            lm_head = self.head.lm_head if eagle3 else self.model.get_output_embeddings()
            mapped = eagle3 and needs_mapping(self.head.d2t, self.vocab_size)
            frequent = self.frequent_ids
            if mapped and frequent is not None:      # frequent target ids inside the draft vocabulary, as draft ids
                d = DraftVocab.index_of(self.head.d2t, self.vocab_size)[frequent.to(self.head.d2t.device)]
                frequent = d[d < self.head.d2t.shape[0]]
            vocab = build_vocab(cfg.method, lm_head.weight, capacity=v.capacity, frequent_ids=frequent,
                                static_size=v.static_size, core_size=v.core_size,
                                lm_head=lm_head if isinstance(lm_head, PackedLinear) else None,
                                pack_fixed=self.packed_linears > 0)
            self._vocabs[key] = DraftVocab(vocab, self.head.d2t, self.head.t2d) if mapped else vocab
        return self._vocabs[key]

    def _draft_features(self, hidden: torch.Tensor) -> torch.Tensor:
        """What the drafter reads: the final hidden states [q, H], or EAGLE-3's three fused states [q, 3H]."""
        return hidden if self._features is None else self._features.take()[0]

    def _new_drafter(self) -> Drafter:
        if self.drafter_factory is not None:
            return self.drafter_factory()
        if isinstance(self.head, Eagle3Head):
            return Eagle3Drafter(self.head, self.model.get_input_embeddings())
        return EagleDrafter(self.head, self.model.get_input_embeddings())


def _eos_ids(model, tokenizer) -> list[int]:
    ids = []
    for src in (getattr(model, "generation_config", None), model.config, tokenizer):
        eos = getattr(src, "eos_token_id", None) if src is not None else None
        if isinstance(eos, int):
            ids.append(eos)
        elif isinstance(eos, (list, tuple)):
            ids.extend(int(e) for e in eos)
    return sorted(set(ids))
