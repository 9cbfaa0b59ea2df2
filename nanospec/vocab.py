"""Draft-vocabulary policies: which LM-head rows the drafter scores (docs/design.md §4).

One small interface serves every policy:
    begin_request(prompt_ids, prompt_top)   Ctx: reset, add prompt ids + target top-k per position
    propose(candidate_ids) -> Proposal      Ext, part 1: find new ids with tensor ops (no host sync)
    commit(proposal, n_new)                 Ext, part 2: evict FIFO, write ids, gather only new rows
    logits(h) -> [q, A]                     drafter logits over the active rows
    slot_ids(slots) -> ids                  map active-row indices back to vocabulary ids
    contains(ids) -> bool tensor

The engine reads `n_new` from the device together with the accepted tokens (one transfer per
step), so finding new ids never syncs on its own. On CUDA the row gather runs on a side stream
and the compute stream waits on its event only right before the next LM-head matmul.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from nanospec.loaders.cpu_linear import PackedLinear, can_pack
from nanospec.timing import PhaseTimer
from nanospec import transfer


@dataclass
class Proposal:
    ids: torch.Tensor    # [M] new ids first (in first-seen order), then padding
    n_new: torch.Tensor  # [] long, on device


class VocabPolicy(Protocol):
    """What the engine and the drafters may ask of a draft vocabulary (every policy below has it)."""

    name: str
    vocab_size: int

    @property
    def size(self) -> int:
        """Active rows now (A)."""

    def begin_request(self, prompt_ids: torch.Tensor, prompt_top: torch.Tensor) -> int:
        """Ctx: reset, then add the prompt ids [n] and the target's top-k per position [n, k]; ids added."""

    def propose(self, candidate_ids: torch.Tensor) -> Proposal | None:
        """Ext, part 1: the new ids among the candidates, on the device (None: the set never grows)."""

    def commit(self, proposal: Proposal | None, n_new: int) -> int:
        """Ext, part 2: write the first `n_new` proposed ids (read from the host) and gather their rows."""

    def wait_ready(self, timer: PhaseTimer | None = None) -> None:
        """Make the compute stream wait for the last row gather (just before the LM-head matmul)."""

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """[q, H] -> [q, A] drafter logits over the active rows."""

    def slot_ids(self, slots: torch.Tensor) -> torch.Tensor:
        """Active-row indices -> vocabulary ids."""

    def contains(self, ids: torch.Tensor) -> torch.Tensor:
        """Bool tensor: which ids are in the active set."""


class FullVocab:
    """EAGLE-2 baseline: every row of the LM head."""

    name = "full"

    def __init__(self, lm_head_weight: torch.Tensor, lm_head: Callable[[torch.Tensor], torch.Tensor] | None = None):
        self.weight = lm_head_weight  # [V, H]
        self.vocab_size = lm_head_weight.shape[0]
        self.rows_gathered = 0
        # the target's own LM-head module when it is faster than a plain matmul (packed on CPU)
        self.project = lm_head

    @property
    def size(self) -> int:
        return self.vocab_size

    def begin_request(self, prompt_ids: torch.Tensor, prompt_top: torch.Tensor) -> int:
        return 0

    def propose(self, candidate_ids: torch.Tensor) -> Proposal | None:
        return None

    def commit(self, proposal: Proposal | None, n_new: int) -> int:
        return 0

    def wait_ready(self, timer: PhaseTimer | None = None) -> None:
        pass

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        if self.project is not None:
            return self.project(h)  # [q, V]
        return h @ self.weight.T  # [q, V]

    def slot_ids(self, slots: torch.Tensor) -> torch.Tensor:
        return slots

    def contains(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.ones_like(ids, dtype=torch.bool)


class ActiveVocab:
    """A pinned core of ids (static / hybrid) plus a FIFO ring of in-context ids (nanospec / hybrid).

    Rows live in one contiguous buffer `[core + capacity, H]`; slots [0, core) hold the core,
    slots [core, core + capacity) the ring. Membership is a bool mask over V (+1 dummy entry)
    and slot ids a long tensor, both on the model's device.
    """

    def __init__(self, lm_head_weight: torch.Tensor, core_ids: torch.Tensor | None, capacity: int,
                 name: str = "nanospec", side_stream: bool = True, pack_fixed: bool = False):
        w = lm_head_weight
        self.name = name
        self.weight = w
        self.vocab_size, hidden = w.shape
        self.device = w.device
        core = core_ids.to(self.device, torch.long) if core_ids is not None else torch.empty(0, dtype=torch.long, device=w.device)
        self.core = core
        self.n_core = int(core.shape[0])
        self.capacity = int(capacity)
        total = self.n_core + self.capacity
        self.buffer = torch.empty(total, hidden, dtype=w.dtype, device=self.device)  # [S, H]
        self.ids = torch.full((total,), -1, dtype=torch.long, device=self.device)
        self.member = torch.zeros(self.vocab_size + 1, dtype=torch.bool, device=self.device)
        # +1: the dummy id V, which a mapped vocabulary (draft_vocab.py) uses for ids it cannot hold
        self._first = torch.empty(self.vocab_size + 1, dtype=torch.long, device=self.device)
        self.stream = torch.cuda.Stream(self.device) if (side_stream and self.device.type == "cuda") else None
        self.ready: torch.cuda.Event | None = None
        self.rows_gathered = 0  # rows copied from the LM head since construction (test hook)
        self._reset()
        # static (no ring): the rows never change, so they can be packed once for the CPU matmul
        self._fixed = None
        if pack_fixed and self.capacity == 0 and self.n_core and can_pack(self.buffer):
            self._fixed = PackedLinear.from_rows(self.buffer)

    # -- state -----------------------------------------------------------------
    def _reset(self) -> None:
        # (values go in with fill_/index_fill_: a Python scalar written by indexing, `t[i] = True`,
        # is a blocking host->device copy on CUDA)
        self.member.zero_()
        self.ids.fill_(-1)
        self.count = 0  # filled ring slots (host int, known from committed n_new)
        self.ptr = 0    # next ring slot to write
        if self.n_core:
            self.ids[: self.n_core] = self.core
            self.member.index_fill_(0, self.core, True)
            self.buffer[: self.n_core] = self.weight.index_select(0, self.core)
            self.rows_gathered += self.n_core

    @property
    def size(self) -> int:
        return self.n_core + self.count

    # -- Ctx / Ext ---------------------------------------------------------------
    def begin_request(self, prompt_ids: torch.Tensor, prompt_top: torch.Tensor) -> int:
        """Ctx: reset the in-context part, then add every prompt id and the target's top-k per position."""
        if self.capacity == 0:
            return 0
        if self.count:
            self.wait_ready()
            self.member.zero_()
            self.ids[self.n_core:].fill_(-1)
            if self.n_core:
                self.member.index_fill_(0, self.core, True)
            self.count, self.ptr = 0, 0
        prop = self.propose(torch.cat([prompt_ids.reshape(-1), prompt_top.reshape(-1)]))
        (n_new,), = transfer.to_host(prop.n_new)
        return self.commit(prop, n_new)

    def propose(self, candidate_ids: torch.Tensor) -> Proposal | None:
        """New ids among the candidates, first-seen order, found with fixed-size tensor ops."""
        if self.capacity == 0:
            return None
        cand = candidate_ids.reshape(-1).to(self.device, torch.long)
        m = cand.shape[0]
        pos = torch.arange(m, device=self.device)
        # first occurrence of each id within the candidates (scatter-min over V)
        self._first.fill_(m)
        self._first.scatter_reduce_(0, cand, pos, reduce="amin")
        fresh = (self._first[cand] == pos) & ~self.member[cand] & (cand < self.vocab_size)
        # stable sort puts the fresh ids first, in the order they were seen
        order = torch.sort((~fresh).to(torch.int8), stable=True).indices
        return Proposal(ids=cand[order], n_new=fresh.sum())

    def commit(self, proposal: Proposal | None, n_new: int) -> int:
        """Write `n_new` proposed ids into the ring (evicting the oldest) and gather only their rows."""
        if proposal is None or n_new == 0:
            return 0
        new = proposal.ids[:n_new][-self.capacity:]  # more new ids than capacity: keep the latest
        n = int(new.shape[0])
        ring = (self.ptr + torch.arange(n, device=self.device)) % self.capacity
        slots = ring + self.n_core
        evicted = self.ids[slots]
        # an empty slot holds -1: clear the dummy entry V instead (never a member)
        self.member.index_fill_(0, torch.where(evicted >= 0, evicted, self.vocab_size), False)
        self.ids[slots] = new
        self.member.index_fill_(0, new, True)
        self._gather(new, slots)
        self.ptr = (self.ptr + n) % self.capacity
        self.count = min(self.capacity, self.count + n)
        return n

    def _gather(self, new: torch.Tensor, slots: torch.Tensor) -> None:
        self.rows_gathered += int(new.shape[0])
        if self.stream is None:
            self.buffer[slots] = self.weight.index_select(0, new)
            return
        # side stream: copy the new rows while the compute stream runs the draft layer
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            self.buffer[slots] = self.weight.index_select(0, new)
            self.ready = torch.cuda.Event()
            self.ready.record(self.stream)
        for t in (new, slots):
            t.record_stream(self.stream)

    def wait_ready(self, timer: PhaseTimer | None = None) -> None:
        """Make the compute stream wait for the last gather (called just before the LM head)."""
        if self.ready is None:
            return
        if timer is None:
            torch.cuda.current_stream(self.device).wait_event(self.ready)
        else:
            with timer.phase("gather_wait"):
                torch.cuda.current_stream(self.device).wait_event(self.ready)
        self.ready = None

    # -- drafting ----------------------------------------------------------------
    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """[q, H] -> [q, A] logits over the active rows only (A = core + filled ring slots)."""
        if self._fixed is not None:
            return self._fixed(h)
        return h @ self.buffer[: self.size].T

    def slot_ids(self, slots: torch.Tensor) -> torch.Tensor:
        return self.ids[slots]

    def contains(self, ids: torch.Tensor) -> torch.Tensor:
        return self.member[ids]


def build_vocab(policy: str, lm_head_weight: torch.Tensor, *, capacity: int,
                frequent_ids: torch.Tensor | None, static_size: int, core_size: int,
                lm_head: Callable[[torch.Tensor], torch.Tensor] | None = None,
                pack_fixed: bool = False) -> VocabPolicy:
    """Policy name -> vocabulary object (a fresh one per engine; `begin_request` resets per request).

    `lm_head` (the target's LM-head module) and `pack_fixed` give the `full` and `static` baselines
    the same fast CPU matmul as the target (see cpu_linear.py), so they are not slowed by a kernel."""
    if policy == "full":
        return FullVocab(lm_head_weight, lm_head)
    if policy in ("static", "hybrid") and frequent_ids is None:
        raise ValueError(f"policy {policy!r} needs a token-frequency table (frequent_ids)")
    if policy == "static":
        return ActiveVocab(lm_head_weight, frequent_ids[:static_size], 0, name="static", pack_fixed=pack_fixed)
    if policy == "nanospec":
        return ActiveVocab(lm_head_weight, None, capacity, name="nanospec")
    if policy == "hybrid":
        return ActiveVocab(lm_head_weight, frequent_ids[:core_size], capacity, name="hybrid")
    raise ValueError(f"policy must be one of full, static, nanospec, hybrid; got {policy!r}")
