"""The decoding loop: prefill, one speculative (or autoregressive) step, streaming and blocking APIs.

    prompt -> prefill -> [draft -> verify -> accept -> advance]* -> text

A speculative step: `_draft` (the drafter's tree, the copy chain, the retrieved branch, the budget's
pruning), the verifying forward, `accept_step` (`bookkeeping.py`: acceptance and the step's one host
read), `_advance` (the budget learns, KV compaction, the vocabulary's Ext, the drafter's update).
`stream()` returns a `Run` (`run.py`) of `StepEvent`s (one per target forward); `generate()` drains
it. The engine reaches the draft head only through `drafter.bind_head` and the `Drafter` protocol."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass

import torch

from nanospec import transfer
from nanospec.config import TREE_OPTIONS, GenerationConfig
from nanospec.decoding.accept import sample_token
from nanospec.decoding.attention import attention_name, use_tree_attention
from nanospec.decoding.bookkeeping import accept_step, single_node_event, spec_event
from nanospec.decoding.budget import BudgetFigures, DraftBudget
from nanospec.decoding.copy_branch import PAD, CopyBranch
from nanospec.decoding.cost_curve import CostCurve, load_or_measure
from nanospec.decoding.drafter import Drafter, bind_head
from nanospec.decoding.kv import compact_cache, new_cache
from nanospec.decoding.prompt import encode_text, eos_ids
from nanospec.decoding.retrieved_branch import RetrievedBranch, start_retrieval
from nanospec.decoding.run import Run, RunResult
from nanospec.decoding.tree import DraftTree, keep_nodes, tree_attention_mask, tree_position_ids
from nanospec.decoding.verify import Acceptance, check_attention_supported, greedy_token, target_forward, warp_probs
from nanospec.events import StepEvent
from nanospec.loaders.cpu_linear import PackedLinear, kernel_summary
from nanospec.loaders.cpu_linear import pack_linears as pack_modules
from nanospec.loaders.half_linear import stabilize_linears
from nanospec.loaders.fused_norm import fuse_rms_norms
from nanospec.options import run_defaults
from nanospec.timing import PhaseTimer, sync
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
    retrieved: RetrievedBranch | None = None  # the retrieved branch (cfg.tree.retrieval_nodes > 0 and a store)


StepHook = Callable[[int, str], None]


class SpecEngine:
    """A target model, optionally a draft head, and the per-policy vocabularies (made lazily).

    `before_step(step, method)`, when set (constructor or attribute), is called on the decoding
    thread before every decoding step after prefill (step 1, 2, ...; `method` is the run's),
    speculative and autoregressive alike: the place to count steps, slow them down or raise to
    abort a run. `timing=False` turns the per-phase timer off (StepEvent.phases are then zeros;
    on CUDA that saves its one event read per step). `retrieval`: the pair's store (`load_pair`)."""

    def __init__(self, model, tokenizer=None, head=None, *,
                 frequent_ids: torch.Tensor | None = None, drafter_factory: Callable[[], Drafter] | None = None,
                 eos_token_ids: list[int] | None = None, pack_linears: bool = True,
                 before_step: StepHook | None = None, timing: bool = True):
        check_attention_supported(model.config)
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.head = head
        # what the head's family decides (its checks, the states it reads, its LM-head rows, its drafter)
        self.drafting = bind_head(model, head, drafter_factory)
        # fp32 on CPU: every linear weight pre-packed in place (cpu_linear.py) for the target, the head and
        # the drafter LM heads alike, so no method gains from a kernel another lacks. CUDA: nothing changes.
        self.packed_linears = self.fused_norms = 0
        if pack_linears:
            self.packed_linears = pack_modules(model) + (pack_modules(head) if head is not None else 0)
            # RMS norms on the fused kernel where it gives the same numbers bit for bit (fused_norm.py)
            self.fused_norms = fuse_rms_norms(model) + (fuse_rms_norms(head) if head is not None else 0)
        self.row_stable_linears = stabilize_linears(model) + (stabilize_linears(head) if head is not None else 0)
        self.device = next(model.parameters()).device
        if self.device.type == "cpu":  # grouped heads without copying the cache under a tree mask (attention.py)
            use_tree_attention(model.config)
            if head is not None and hasattr(head, "config"):
                use_tree_attention(head.config)
        self.kernels = (f"{kernel_summary(self.packed_linears, self.device, model)}; {self.fused_norms} fused RMS norms; "
                        f"attention: {attention_name(model) or '?'}")
        logger.info("decoding on %s: %s", self.device, self.kernels)  # which path, said once per engine
        self.lm_head_weight = model.get_output_embeddings().weight  # [V, H]
        self.vocab_size = self.lm_head_weight.shape[0]
        self.frequent_ids = frequent_ids
        self.max_context = int(getattr(model.config, "max_position_embeddings", 1 << 30))
        self.drafter_factory = drafter_factory  # None: the head family's drafter over `head`
        self.before_step = before_step
        self.timing = timing  # per-phase times in each StepEvent (on CUDA: one event read per step)
        self._vocabs: dict[tuple, object] = {}
        self._cost_curve: CostCurve | None = None
        self._budgets: dict[str, DraftBudget] = {}  # per method: the last request's draft budget
        self.retrieval = None  # the pair's RetrievalIndex (load_pair sets it); None: no retrieved branch
        if eos_token_ids is None:
            eos_token_ids = eos_ids(model, tokenizer)
        self.eos_token_ids = set(eos_token_ids)

    # -- public API ------------------------------------------------------------------
    def encode(self, prompt: str | list[dict], chat: bool | None = None) -> list[int]:
        """Text or chat turns -> ids; the chat template is applied when the tokenizer has one."""
        return encode_text(self.tokenizer, prompt, chat)

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
        """Validate everything, then return a `Run` that decodes lazily as it is iterated. Keyword
        options that set no tree option (`config.TREE_OPTIONS`: `depth`, `top_k`, `total_tokens`,
        `copy_branch`, `copy_ngram`) start from the device's run defaults (`options.run_defaults`,
        which give `config.default_tree`); a `GenerationConfig` is used exactly as given."""
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
        drafter = self.drafting.new_drafter() if spec else None
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
                drafter.begin(ids[0], self.drafting.features(hidden), first)
        state = _State(cache, n, first, first_dev, 0, gen)
        if vocab is not None:
            self._begin_copy_and_budget(state, ids[0], cfg)
            state.retrieved = start_retrieval(self.retrieval, cfg.tree, prompt_ids, first, self.device)
        tokens = self._take([first], state, cfg)
        phases = timer.resolve()
        sync(self.device)
        event = single_node_event(0, cfg.method, int(prompt_ids[-1]), first, tokens,
                                  vocab.size if vocab is not None else 0, added, self.vocab_size, t0, phases,
                                  tree_sources=["root"])
        return state, event

    def _begin_copy_and_budget(self, state: _State, prompt: torch.Tensor, cfg: GenerationConfig) -> None:
        """A speculative request's context-copy branch and draft budget, when its tree options ask for them."""
        if cfg.tree.copy_branch:
            state.copy = CopyBranch(cfg.tree.copy_branch, cfg.tree.copy_ngram, self.device)
            state.copy.begin(prompt, state.root)
        if cfg.tree.budget:
            state.budget = DraftBudget(self.cost_curve(cfg.tree.max_nodes), cfg.tree.max_depth, self.device,
                                       earlier=self._budgets.get(cfg.method), max_nodes=cfg.tree.max_nodes)
            self._budgets[cfg.method] = state.budget  # the next request of this method starts from its statistics

    @torch.inference_mode()
    def _spec_step(self, step: int, state: _State, cfg: GenerationConfig, vocab: VocabPolicy,
                   drafter: Drafter, timer: PhaseTimer) -> StepEvent:
        t0 = time.perf_counter()
        active_size = vocab.size
        tree, figures = self._draft(state, cfg, vocab, drafter, timer)
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
            acc = accept_step(tree, out.logits, argmax, candidates, vocab, cfg.sampling, state.generator, figures)
        accepted, added = self._advance(state, tree, acc, out.hidden, vocab, drafter, timer)
        tokens = self._take(accepted + [acc.bonus], state, cfg)
        phases = timer.resolve()
        event = spec_event(step, cfg.method, acc, accepted, tokens, active_size, added, self.vocab_size, t0, phases)
        if state.budget is not None:
            figures = acc.figures
            event.drafted_nodes = figures.drafted_nodes
            event.expected_tokens = round(figures.expected_tokens, 4)
            event.budget_threshold = round(figures.price, 6)
            state.budget.observe(len(accepted) + 1, event.wall_ms, len(event.tree_tokens))
        return event

    def _draft(self, state: _State, cfg: GenerationConfig, vocab: VocabPolicy, drafter: Drafter,
               timer: PhaseTimer) -> tuple[DraftTree, BudgetFigures | None]:
        """The step's tree: the drafter's, both branches merged in, then what the budget keeps of it."""
        budget = state.budget
        fixed = cfg.tree.fixed_shape or self.device.type != "cpu"  # a shape that never depends on data
        # a CPU may read the host: stop drafting deeper once no frontier node could pay
        drafter.keep_drafting = None if budget is None or fixed else budget.keep_drafting
        tree = drafter.draft(state.root_dev, vocab, cfg.tree, timer)
        if state.copy is not None:
            tree = state.copy.extend(tree, vocab, timer, cfg.tree.fixed_shape)
        if state.retrieved is not None:  # the retrieved branch after it (retrieved_branch.py)
            tree = state.retrieved.extend(tree, vocab, timer, cfg.tree.fixed_shape)
        if budget is None:
            return tree, None
        with timer.phase("budget"):
            keep, expected = budget.select(tree)
            figures = BudgetFigures(expected_tokens=expected, drafted_nodes=len(tree), price=budget.threshold)
            if fixed:  # the count of drafted nodes (PAD slots excluded) comes with the step's one read
                if tree.sources is not None:
                    figures.drafted_nodes = (tree.sources != PAD).sum()
                return dataclasses.replace(tree, enabled=keep), figures
            return keep_nodes(tree, keep), figures

    def _advance(self, state: _State, tree: DraftTree, acc: Acceptance, hidden: torch.Tensor,
                 vocab: VocabPolicy, drafter: Drafter, timer: PhaseTimer) -> tuple[list[int], int]:
        """After acceptance: teach the budget, keep the accepted path's KV entries, commit the vocabulary's
        Ext, feed the drafter and both branches. Returns the accepted draft tokens and the ids added."""
        keep = acc.keep
        if state.budget is not None:
            with timer.phase("budget"):
                on_path = torch.zeros(len(tree), dtype=torch.bool, device=self.device).index_fill_(0, keep, True)
                enabled = tree.enabled if tree.enabled is not None else torch.ones_like(on_path)
                state.budget.learn(tree, enabled, on_path)
        if len(tree) > 1:  # a lone root's entry is already where it belongs
            with timer.phase("kv_compact"):
                compact_cache(state.cache, state.length, keep, acc.path)
        with timer.phase("vocab_update"):
            added = vocab.commit(acc.proposal, acc.n_new)
        next_tokens = torch.cat([tree.tokens[keep[1:]], acc.bonus_dev])
        drafter.update(self.drafting.features(hidden)[keep], next_tokens, timer)
        if state.copy is not None:
            state.copy.append(next_tokens)
        accepted = [acc.tree.tokens[i] for i in acc.path[1:]]
        if state.retrieved is not None:  # host ids, which the step's one read brought
            state.retrieved.append(accepted + [acc.bonus])
        state.length += len(acc.path)
        state.root, state.root_dev = acc.bonus, acc.bonus_dev
        return accepted, added

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

    def _vocab(self, cfg: GenerationConfig) -> VocabPolicy:
        v = cfg.vocab
        key = (cfg.method, v.capacity, v.static_size, v.core_size)
        if key not in self._vocabs:
            lm_head = self.drafting.lm_head  # the rows the drafter scores (the target's, or the head's own)
            vocab = build_vocab(cfg.method, lm_head.weight, capacity=v.capacity,
                                frequent_ids=self.drafting.draft_ids(self.frequent_ids),
                                static_size=v.static_size, core_size=v.core_size,
                                lm_head=lm_head if isinstance(lm_head, PackedLinear) else None,
                                pack_fixed=self.packed_linears > 0)
            self._vocabs[key] = self.drafting.wrap(vocab)
        return self._vocabs[key]
