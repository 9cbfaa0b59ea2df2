"""The retrieval datastore: suffix array, longest match, continuation trees, in-memory additions and
save/load (the build and bench commands: test_retrieval_build.py). Brute force is the reference."""

from __future__ import annotations

import numpy as np
import pytest

from nanospec.retrieval import LookupSettings, RetrievalIndex, SuffixStore, continuation_tree, load_store, save_store
from nanospec.retrieval.store import NO_MATCH
from nanospec.retrieval.suffix_array import suffix_array


def brute_suffix_array(text) -> list[int]:
    seq = [int(t) for t in text]
    return sorted(range(len(seq)), key=lambda i: seq[i:])


def brute_longest(docs: list[list[int]], context: list[int], max_len: int, min_len: int, depth: int):
    """(length, sorted continuations) of the longest context suffix occurring inside one document."""
    for length in range(min(max_len, len(context)), min_len - 1, -1):
        pat = context[len(context) - length:]
        conts = [tuple(d[p + length:p + length + depth] + [-1] * depth)[:depth]
                 for d in docs for p in range(len(d) - length + 1) if d[p:p + length] == pat]
        if conts:
            return length, sorted(conts)
    return 0, []


def brute_trie(conts: np.ndarray) -> dict[tuple, int]:
    """path -> how many rows start with it (rows whose first token is -1 are left out)."""
    counts: dict[tuple, int] = {}
    for row in conts.tolist():
        for d in range(len(row)):
            if row[d] < 0:
                break
            counts[tuple(row[:d + 1])] = counts.get(tuple(row[:d + 1]), 0) + 1
    return counts


def paths(tree) -> list[tuple]:
    out = []
    for i in range(len(tree)):
        path, node = [], i
        while node >= 0:
            path.append(int(tree.tokens[node]))
            node = int(tree.parents[node])
        out.append(tuple(path[::-1]))
    return out


# ---- suffix array ---------------------------------------------------------------------------------


@pytest.mark.parametrize("n,alphabet", [(0, 3), (1, 3), (2, 1), (17, 1), (64, 2), (200, 3), (300, 50), (500, 65535)])
def test_suffix_array_matches_brute_force(n, alphabet):
    rng = np.random.default_rng(n * 7 + alphabet)
    for dtype in (np.uint16, np.int64):
        text = rng.integers(0, alphabet, n).astype(dtype)
        assert suffix_array(text).tolist() == brute_suffix_array(text)
        assert suffix_array(text).dtype == np.int32


def test_suffix_array_on_periodic_text():
    text = np.array([1, 2, 3] * 40 + [1, 2], dtype=np.uint16)
    assert suffix_array(text).tolist() == brute_suffix_array(text)


def test_suffix_array_rejects_2d():
    with pytest.raises(ValueError, match="1-D"):
        suffix_array(np.zeros((2, 2)))


# ---- longest match --------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(6))
def test_longest_match_and_continuations_match_brute_force(seed):
    rng = np.random.default_rng(seed)
    alphabet = int(rng.integers(2, 6))
    docs = [rng.integers(0, alphabet, int(rng.integers(1, 40))).tolist() for _ in range(int(rng.integers(1, 8)))]
    store = SuffixStore.from_documents(docs)
    for _ in range(60):
        context = rng.integers(0, alphabet + 1, int(rng.integers(1, 12))).tolist()   # alphabet: never stored
        max_len, min_len, depth = int(rng.integers(2, 9)), int(rng.integers(1, 3)), 4
        length, conts = brute_longest(docs, context, max_len, min_len, depth)
        match = store.longest_match(context, max_len, min_len)
        assert match.length == length, (docs, context)
        got = store.continuations(store.continuation_starts(match, cap=10 ** 6), depth)
        assert sorted(map(tuple, got.tolist())) == conts


def test_longest_match_prefers_the_longest_suffix():
    store = SuffixStore.from_documents([[5, 6, 7, 8], [1, 6, 7, 9], [7, 3]])
    m = store.longest_match([0, 5, 6, 7])
    assert (m.length, m.count) == (3, 1)
    assert store.continuations(store.continuation_starts(m), 2).tolist() == [[8, -1]]
    m = store.longest_match([0, 6, 7])
    assert (m.length, m.count) == (2, 2)
    assert store.longest_match([4, 7]) == NO_MATCH                 # only 1 token matches: below min_len
    assert store.longest_match([4, 7], min_len=1).count == 3


def test_matches_never_cross_a_document_boundary():
    store = SuffixStore.from_documents([[1, 2], [3, 4], [2, 3, 9]])
    # [2, 3] only occurs inside doc 2, never across docs 0 | 1
    m = store.longest_match([2, 3])
    assert (m.length, m.count) == (2, 1)
    assert store.continuations(store.continuation_starts(m), 3).tolist() == [[9, -1, -1]]
    # [1, 2, 3] and [2, 3, 4] would span docs 0 and 1: only their 2-token suffixes match
    assert store.longest_match([1, 2, 3]).length == 2
    m = store.longest_match([5, 2, 3, 4])
    assert (m.length, m.count) == (2, 1)
    assert store.continuations(store.continuation_starts(m), 2).tolist() == [[-1, -1]]
    # continuations stop at a document's end: after [1, 2] there is nothing
    m = store.longest_match([1, 2])
    assert store.continuations(store.continuation_starts(m), 2).tolist() == [[-1, -1]]
    index = RetrievalIndex(store)
    tree = index.lookup([1, 2])
    assert len(tree) == 0 and tree.occurrences == 0


def test_ids_outside_the_store_never_match():
    store = SuffixStore.from_documents([[1, 2, 3]])
    assert store.longest_match([1, 2, 70000]) == NO_MATCH          # above uint16: cannot be stored
    assert store.longest_match([-1, 2, 3], min_len=2).length == 2  # cut before the impossible id
    with pytest.raises(ValueError):
        store.longest_match([1, 2], max_len=1, min_len=2)


def test_wide_vocabularies_use_uint32():
    store = SuffixStore.from_documents([[70000, 1, 2], [70000, 1, 3]])
    assert store.tokens.dtype == np.uint32
    assert store.longest_match([70000, 1]).count == 2


# ---- continuation trees ---------------------------------------------------------------------------


def hand_made_index(**kw) -> RetrievalIndex:
    a, b, c, d, e, x = 10, 11, 12, 13, 14, 15
    docs = [[a, b, c, d], [a, b, c, e], [a, b, c, d], [a, b, x]]
    return RetrievalIndex(SuffixStore.from_documents(docs), LookupSettings(**kw))


def test_counts_and_probabilities_on_a_hand_made_store():
    tree = hand_made_index(depth=3, max_nodes=10).lookup([7, 10, 11])
    assert tree.match_length == 2 and tree.occurrences == 4
    got = {p: (int(c), float(q)) for p, c, q in zip(paths(tree), tree.counts, tree.probs)}
    assert got == {(12,): (3, 0.75), (15,): (1, 0.25), (12, 13): (2, 2 / 3), (12, 14): (1, 1 / 3)}
    assert tree.depths.tolist() == [len(p) for p in paths(tree)]
    assert all(p < i for i, p in enumerate(tree.parents.tolist()))        # parents first
    np.testing.assert_allclose(tree.path_probs, [c / 4 for c in tree.counts])


def test_the_node_budget_keeps_the_most_frequent_ancestor_closed_nodes():
    tree = hand_made_index(depth=3, max_nodes=3).lookup([10, 11])
    assert paths(tree) == [(12,), (15,), (12, 13)]          # c (3), c d (2), then x (1, shallower than c e)
    assert tree.parents.tolist() == [-1, -1, 0]
    tree = hand_made_index(depth=3, max_nodes=10, min_count=2).lookup([10, 11])
    assert paths(tree) == [(12,), (12, 13)]


@pytest.mark.parametrize("seed", range(8))
def test_continuation_tree_matches_a_brute_force_trie(seed):
    rng = np.random.default_rng(seed)
    m, depth = int(rng.integers(1, 40)), int(rng.integers(1, 6))
    conts = rng.integers(0, 3, (m, depth))
    ends = rng.integers(0, depth + 1, m)                                # each row ends somewhere
    conts[np.arange(depth)[None, :] >= ends[:, None]] = -1
    want = brute_trie(conts)
    n_rows = int((conts[:, 0] >= 0).sum())
    full = continuation_tree(conts, max_nodes=10 ** 6)
    assert full.occurrences == n_rows
    assert dict(zip(paths(full), full.counts.tolist())) == want
    for p, q in zip(paths(full), full.probs.tolist()):
        parent = want[p[:-1]] if len(p) > 1 else n_rows
        assert q == pytest.approx(want[p] / parent)
    budget = int(rng.integers(1, 6))
    small = continuation_tree(conts, max_nodes=budget)
    kept = paths(small)
    assert len(kept) == min(budget, len(want))
    assert all(p[:-1] in kept for p in kept if len(p) > 1)              # ancestor-closed
    worst_kept = min((want[p] for p in kept), default=0)
    assert all(want[p] <= worst_kept for p in want if p not in kept)     # the most frequent ones


def test_empty_inputs_give_an_empty_tree():
    assert len(continuation_tree(np.zeros((0, 3), dtype=np.int64), 5)) == 0
    assert len(continuation_tree(np.full((2, 3), -1), 5)) == 0
    assert len(RetrievalIndex(None).lookup([1, 2, 3])) == 0
    with pytest.raises(ValueError):
        LookupSettings(min_match=0)


# ---- in-memory additions ------------------------------------------------------------------------


def test_added_answers_are_found_and_counted_with_the_store():
    index = hand_made_index(depth=2, max_nodes=10)
    index.add_document([10, 11, 15, 16])
    tree = index.lookup([10, 11])
    assert tree.occurrences == 5                                           # 4 stored + 1 added
    assert dict(zip(paths(tree), tree.counts.tolist()))[(15,)] == 2
    index.add_document([20, 21, 22, 23])
    tree = index.lookup([5, 20, 21, 22])                                   # only the memory has it
    assert (tree.match_length, paths(tree)) == (3, [(23,)])


def test_memory_keeps_the_newest_answers_under_its_cap():
    index = RetrievalIndex(None, LookupSettings(depth=1), memory_tokens=12)
    index.add_document([1, 2, 3, 4, 5])
    index.add_document([6, 7, 8, 9, 10])
    index.add_document([11, 12, 13, 14, 15])
    assert len(index.lookup([1, 2])) == 0                                  # dropped
    assert paths(index.lookup([11, 12])) == [(13,)]


# ---- save / load --------------------------------------------------------------------------------


def small_store() -> SuffixStore:
    rng = np.random.default_rng(1)
    return SuffixStore.from_documents([rng.integers(0, 50, 30) for _ in range(5)])


def test_save_load_roundtrip(tmp_path):
    store = small_store()
    path = tmp_path / "store.npz"
    save_store(path, store, {"tokenizer": "tok-a", "settings": {"prompt_tail": -1}})
    lines: list[str] = []
    back = load_store(path, "tok-a", warn=lines.append)
    assert back is not None and not lines
    for name in ("tokens", "offsets", "sa"):
        np.testing.assert_array_equal(getattr(back, name), getattr(store, name))
    assert back.tokens.dtype == store.tokens.dtype
    assert back.manifest["tokens"] == len(store) and back.manifest["documents"] == 5
    assert back.manifest["settings"] == {"prompt_tail": -1}
    ctx = store.document(2)[:6]
    a, b = RetrievalIndex(store).lookup(ctx), RetrievalIndex(back).lookup(ctx)
    assert paths(a) == paths(b) and a.counts.tolist() == b.counts.tolist()


def corrupt(path, how: str) -> None:
    raw = path.read_bytes()
    if how == "truncated":
        path.write_bytes(raw[: len(raw) // 2])
    elif how == "junk":
        path.write_bytes(b"not a zip file at all" * 10)
    elif how == "empty":
        path.write_bytes(b"")


@pytest.mark.parametrize("how", ["missing", "truncated", "junk", "empty", "foreign", "altered", "no-sa", "format"])
def test_bad_store_files_give_none_and_one_warning(tmp_path, how):
    store = small_store()
    path = tmp_path / "store.npz"
    manifest = {"tokenizer": "tok-a"}
    if how != "missing":
        save_store(path, store, manifest)
    if how in ("truncated", "junk", "empty"):
        corrupt(path, how)
    elif how == "foreign":
        save_store(path, store, {"tokenizer": "tok-b"})
    elif how in ("altered", "no-sa", "format"):
        with np.load(path) as z:
            arrays = {k: z[k] for k in z.files}
        if how == "altered":
            arrays["tokens"] = arrays["tokens"].copy()
            arrays["tokens"][0] ^= 1
        elif how == "no-sa":
            del arrays["sa"]
        else:
            arrays["manifest"] = np.array('{"format": 99}')
        np.savez_compressed(path, **arrays)
    lines: list[str] = []
    assert load_store(path, "tok-a", warn=lines.append) is None
    assert len(lines) == 1 and str(path) in lines[0] and "\n" not in lines[0], lines


def test_a_store_loads_without_a_tokenizer_check(tmp_path):
    path = tmp_path / "s.npz"
    save_store(path, small_store(), {"tokenizer": "tok-b"})
    assert load_store(path, None, warn=lambda line: None) is not None
