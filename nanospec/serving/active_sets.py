"""NanoSpec's active vocabulary for a whole batch of requests, as tensors (no vLLM here).

One pool row per live request holds that request's in-context set exactly as `nanospec.vocab.ActiveVocab`
keeps it for one request: a FIFO ring of `capacity` ids (slot order = insertion order modulo the ring),
a membership mask over V, and the same rule when more new ids arrive than the ring holds (keep the
latest). What the batch adds is that every operation covers all rows at once:

    sets = ActiveSets(vocab_size=V, capacity=3072, device=w.device)
    rows = sets.rows_for(["req-a", "req-b"])          # pool row per batch row (host bookkeeping)
    sets.add(cand_rows, cand_ids)                       # Ctx / Ext: candidates of every row, one pass
    tokens = sets.argmax(h, rows, weight, width)        # draft argmax over each row's active ids only
    sets.free("req-a")                                  # the request finished

`topk_ids` gives the target's top-k at many positions in chunks (Ctx), and `check_pair` refuses a draft
head that does not fit its target before any serving engine loads weights.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

TOPK_CHUNK = 256  # positions per LM-head product in `topk_ids`: bounds the [chunk, V] logits in memory


class ActiveSets:
    """Per-request in-context sets for a batch, in one pool: `ids` [R, capacity + 1] (column `capacity`
    is a scratch slot for writes that must land nowhere; -1 = empty), `member` [R, V + 1] (column V is
    the scratch id, never a member), and `ptr` / `count` [R] (next ring slot, filled slots)."""

    def __init__(self, vocab_size: int, capacity: int, device: torch.device | str = "cpu", rows: int = 8):
        if capacity < 1:
            raise ValueError(f"capacity must be an integer >= 1; got {capacity!r}")
        self.vocab_size = int(vocab_size)
        self.capacity = int(capacity)
        self.device = torch.device(device)
        self.row_of: dict[str, int] = {}  # request id -> pool row
        self._free_rows: list[int] = []
        self._alloc(rows)

    def _alloc(self, rows: int) -> None:
        v, c, dev = self.vocab_size, self.capacity, self.device
        self.ids = torch.full((rows, c + 1), -1, dtype=torch.long, device=dev)
        self.member = torch.zeros((rows, v + 1), dtype=torch.bool, device=dev)
        self.ptr = torch.zeros(rows, dtype=torch.long, device=dev)
        self.count = torch.zeros(rows, dtype=torch.long, device=dev)
        self._free_rows = list(range(rows - 1, -1, -1))

    def _grow(self) -> None:
        """Double the pool (more live requests than rows): old rows keep their place."""
        old = (self.ids, self.member, self.ptr, self.count)
        n = old[0].shape[0]
        self._alloc(2 * n)
        for new, prev in zip((self.ids, self.member, self.ptr, self.count), old):
            new[:n] = prev
        self._free_rows = list(range(2 * n - 1, n - 1, -1))

    # -- bookkeeping (host) ---------------------------------------------------------
    @property
    def pool_rows(self) -> int:
        return int(self.ids.shape[0])

    def rows_for(self, req_ids: list[str]) -> list[int]:
        """Pool row of each request, taking a fresh (empty) row for a request seen the first time."""
        out = []
        for req in req_ids:
            row = self.row_of.get(req)
            if row is None:
                if not self._free_rows:
                    self._grow()
                row = self.row_of[req] = self._free_rows.pop()
            out.append(row)
        return out

    def free(self, req_id: str) -> bool:
        """Empty a finished request's row and return it to the pool; False if the request had none."""
        row = self.row_of.pop(req_id, None)
        if row is None:
            return False
        self.ids[row].fill_(-1)
        self.member[row].zero_()
        self.ptr[row: row + 1].zero_()
        self.count[row: row + 1].zero_()
        self._free_rows.append(row)
        return True

    # -- Ctx / Ext ------------------------------------------------------------------
    def add(self, rows: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
        """Add candidate ids to their rows' sets, every row at once; returns the new ids per pool row [R].

        `rows` [M] is each candidate's pool row, `cand` [M] the id (ids outside [0, V) are ignored).
        Within a row, new ids enter the ring in the order they come (first occurrence), evicting the
        oldest; more new ids than `capacity` keep only the latest, as `ActiveVocab.commit` does."""
        rows = rows.reshape(-1).to(self.device, torch.long)
        cand = cand.reshape(-1).to(self.device, torch.long)
        assert rows.shape == cand.shape, (rows.shape, cand.shape)
        v, c, r_n = self.vocab_size, self.capacity, self.pool_rows
        valid = (cand >= 0) & (cand < v)
        cand = torch.where(valid, cand, v)
        # first occurrence of each (row, id): stable sort by key, a run's head is its first occurrence
        key = rows * (v + 1) + cand
        order = torch.sort(key, stable=True).indices
        sk = key[order]
        head = torch.ones_like(sk, dtype=torch.bool)
        head[1:] = sk[1:] != sk[:-1]
        first = torch.empty_like(head).scatter_(0, order, head)
        fresh = first & valid & ~self.member[rows, cand]
        # group by row (stable: arrival order kept) and rank the fresh ids within their row
        by_row = torch.sort(rows, stable=True).indices
        r, ids, f = rows[by_row], cand[by_row], fresh[by_row].long()
        n_new = torch.zeros(r_n, dtype=torch.long, device=self.device).scatter_add_(0, r, f)  # [R]
        start = torch.cumsum(n_new, 0) - n_new  # [R] fresh ids in earlier rows
        rank = torch.cumsum(f, 0) - 1 - start[r]  # [M] 0.. within the row (valid where f)
        skip = (n_new - c).clamp(min=0)  # [R] more new than capacity: the first `skip` never land
        kept = f.bool() & (rank >= skip[r])
        slot = torch.where(kept, (self.ptr[r] + rank - skip[r]) % c, c)  # scratch column when not kept
        evicted = self.ids[r, slot]  # [M] -1 for empty slots and the scratch column
        self.member.index_put_((r, torch.where(kept & (evicted >= 0), evicted, v)), torch.zeros_like(kept))
        self.ids.index_put_((r, slot), torch.where(kept, ids, -1))
        self.member.index_put_((r, torch.where(kept, ids, v)), kept)
        self.member[:, v].fill_(False)  # fill_, not `= False`: a Python scalar written in is a blocking copy on CUDA
        self.ids[:, c].fill_(-1)
        landed = n_new.clamp(max=c)
        self.ptr = (self.ptr + landed) % c
        self.count = (self.count + landed).clamp(max=c)
        return n_new

    def contains(self, rows: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Bool [B]: is ids[i] in row rows[i]'s set (ids outside [0, V) are not)."""
        ids = ids.to(self.device, torch.long)
        ok = (ids >= 0) & (ids < self.vocab_size)
        return self.member[rows, torch.where(ok, ids, self.vocab_size)] & ok

    def members(self, row: int) -> list[int]:
        """Row `row`'s ids in slot order (tests and reports; syncs)."""
        ids = self.ids[row, : self.capacity]
        return [int(i) for i in ids[ids >= 0].tolist()]

    # -- drafting -------------------------------------------------------------------
    def gather(self, rows: torch.Tensor, weight: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Each batch row's active ids [B, W] (padding: a valid id, 0) with a mask, and their LM-head rows
        [B, W, H]. Slots fill in order until the ring is full, so the first `width` = max count hold them all."""
        width = max(1, min(int(width), self.capacity))
        ids = self.ids[rows, :width]  # [B, W]
        ok = ids >= 0
        safe = torch.where(ok, ids, 0)
        return safe, ok, weight[safe]  # rows: [B, W, H]

    @staticmethod
    def argmax_over(h: torch.Tensor, safe: torch.Tensor, ok: torch.Tensor, rows_w: torch.Tensor) -> torch.Tensor:
        """[B, H] hidden states -> [B] full-vocabulary ids: one bmm over each row's active LM-head rows."""
        logits = torch.bmm(rows_w, h.to(rows_w.dtype).unsqueeze(-1)).squeeze(-1)  # [B, W]
        logits = logits.masked_fill(~ok, float("-inf"))
        slot = logits.argmax(dim=-1)  # [B]
        return safe.gather(1, slot.unsqueeze(1)).squeeze(1)

    def argmax(self, h: torch.Tensor, rows: torch.Tensor, weight: torch.Tensor, width: int | None = None) -> torch.Tensor:
        """Draft argmax of each batch row over its own active set only, mapped back to vocabulary ids."""
        safe, ok, rows_w = self.gather(rows, weight, self.capacity if width is None else width)
        return self.argmax_over(h, safe, ok, rows_w)


def topk_ids(hidden: torch.Tensor, weight: torch.Tensor, k: int, chunk: int = TOPK_CHUNK) -> torch.Tensor:
    """The LM head's top-k ids at every position: [N, H] -> [N, k], `chunk` positions per product."""
    n = hidden.shape[0]
    out = torch.empty((n, k), dtype=torch.long, device=hidden.device)
    for s in range(0, n, chunk):
        logits = torch.nn.functional.linear(hidden[s: s + chunk].to(weight.dtype), weight)  # [c, V]
        out[s: s + chunk] = logits.topk(k, dim=-1).indices
    return out


# -- the head/target check ------------------------------------------------------------

def _config(folder: str | Path, what: str) -> dict:
    path = Path(folder) / "config.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"{what} {folder}: cannot read config.json ({err})") from None


def check_configs(target: dict, head: dict, target_name: str = "target", head_name: str = "head") -> None:
    """ValueError unless an EAGLE head's config fits its target's: the same hidden size as the target's (the
    head reads the target's features; EAGLE-3's `target_hidden_size`) and the same vocabulary (it drafts over
    the target's ids)."""
    problems = []
    t_hidden = target.get("hidden_size")
    h_hidden = head.get("target_hidden_size") or head.get("hidden_size")
    if t_hidden is None or h_hidden is None or int(t_hidden) != int(h_hidden):
        problems.append(f"hidden size {h_hidden} (head) vs {t_hidden} (target)")
    t_vocab, h_vocab = target.get("vocab_size"), head.get("vocab_size")
    if t_vocab is None or (h_vocab is not None and int(h_vocab) != int(t_vocab)):
        problems.append(f"vocabulary {h_vocab} (head) vs {t_vocab} (target)")
    if problems:
        raise ValueError(f"draft head {head_name} does not fit target {target_name}: " + "; ".join(problems)
                         + ". The NanoSpec active vocabulary needs an EAGLE head trained for this target "
                           "(same hidden size, same vocabulary).")


def check_pair(target_dir: str | Path, head_dir: str | Path) -> None:
    """Refuse a head/target mismatch from the two folders' config.json, before a serving engine loads
    any weight (ValueError saying what differs)."""
    check_configs(_config(target_dir, "target"), _config(head_dir, "draft head"), str(target_dir), str(head_dir))
