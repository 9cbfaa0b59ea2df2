"""oneDNN pre-packed linears: same results as nn.Linear, tied weights stay tied, engines stay lossless."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from nanospec.config import METHODS, GenerationConfig
from nanospec.loaders.cpu_linear import (ONE_ROW_COPIES, PackedLinear, mkl_packed_available, mkl_rows_stable,
                                         onednn_linear_available, onednn_one_row_stable, pack_linears,
                                         packed_kernel)
from nanospec.decoding.engine import SpecEngine
from nanospec.bench.random_pair import random_head, random_target, random_target_config
from nanospec.vocab import ActiveVocab, FullVocab

pytestmark = pytest.mark.skipif(not onednn_linear_available(), reason="this torch build has no oneDNN packed linear")


def _tiny(seed: int = 0):
    cfg = random_target_config(512, 32, 2, heads=2, kv_heads=1, intermediate=64, max_positions=128)
    return random_target(cfg, seed=seed), random_head(cfg, seed=seed + 1)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(24,), (1, 24), (7, 24), (2, 5, 24)])
def test_packed_linear_matches_linear(bias, shape):
    torch.manual_seed(0)
    lin = nn.Linear(24, 40, bias=bias)
    packed = PackedLinear(lin)
    x = torch.randn(*shape)
    with torch.no_grad():
        want, got = lin(x), packed(x)
    assert got.shape == want.shape == (*shape[:-1], 40)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


KERNEL_OPS = {"onednn": (torch.ops.mkldnn, "_linear_pointwise"), "mkl": (torch.ops.mkl, "_mkl_linear")}


def _count_kernel_calls(monkeypatch, kernel: str) -> list:
    calls = []
    ns, name = KERNEL_OPS[kernel]
    real = getattr(ns, name)
    monkeypatch.setattr(ns, name, lambda x, *a: calls.append(x.shape[0]) or real(x, *a))
    return calls


def test_with_mkl_one_row_takes_f_linear_and_several_rows_the_packed_kernel(monkeypatch):
    """With MKL's packed sgemm (row-stable Xeons), one row (a plain decoding step) goes to F.linear, as fast
    or faster there, bit for bit; several rows (a verified tree) take the packed kernel."""
    if not mkl_packed_available():
        pytest.skip("no MKL packed sgemm in this torch build")
    monkeypatch.setenv("NANOSPEC_PACKED_KERNEL", "mkl")
    torch.manual_seed(0)
    lin = nn.Linear(24, 40)
    packed = PackedLinear(lin)
    assert packed.kernel == "mkl"
    calls = _count_kernel_calls(monkeypatch, "mkl")
    with torch.inference_mode():
        for shape in [(24,), (1, 24), (1, 1, 24)]:
            x = torch.randn(*shape)
            assert torch.equal(packed(x), F.linear(x, lin.weight, lin.bias))
        assert calls == []
        y = packed(torch.randn(1, 3, 24))
    assert calls == [3] and y.shape == (1, 3, 40)


@pytest.mark.parametrize("stable", [False, True], ids=["one-row-path-differs", "one-row-path-stable"])
def test_with_onednn_one_row_goes_to_the_packed_kernel_alone_or_as_copies(monkeypatch, stable):
    """With oneDNN's packed kernel, one row goes there too: alone where its one-row path gives it the bits it
    gets among the rows of a verified tree at that shape, else as copies of itself."""
    import nanospec.loaders.cpu_linear as cpu_linear
    monkeypatch.setenv("NANOSPEC_PACKED_KERNEL", "onednn")
    monkeypatch.setattr(cpu_linear, "onednn_one_row_stable", lambda *shape, **kw: stable)
    torch.manual_seed(0)
    packed = PackedLinear(nn.Linear(24, 40))
    assert packed.kernel == "onednn" and packed.copies == (1 if stable else ONE_ROW_COPIES)
    calls = _count_kernel_calls(monkeypatch, "onednn")
    x = torch.randn(3, 24)
    with torch.inference_mode():
        several = packed(x)
        for shape in [(24,), (1, 24), (1, 1, 24)]:
            one = packed(x[0].reshape(shape))
            assert one.shape == (*shape[:-1], 40)
            if stable and not onednn_one_row_stable(40, 24, True):
                continue  # made to go alone where the real probe says it may not: no equal bits to expect
            assert torch.equal(one.reshape(40), several[0])
    assert calls == [3] + [packed.copies] * 3
    monkeypatch.setenv("NANOSPEC_ONE_ROW_COPIES", "4")   # a measurement of the copies where the probe says alone
    assert PackedLinear(nn.Linear(24, 40)).copies == 4


@pytest.mark.parametrize("shape", [(576, 1536), (1536, 576), (4096, 576)])
def test_onednn_rows_do_not_depend_on_how_many_rows_come_with_them(monkeypatch, shape):
    """On oneDNN's kernel a row gets the same bits alone (a plain step) and among 2..24 rows (a verified
    tree), at the default target's shapes: 576 x 1536 is the MLP's down projection, whose one-row path
    sums in another order on some AMD EPYC CPUs (there a single row goes as copies; where the probe finds the
    one-row path stable, alone): either way the guarantee holds."""
    monkeypatch.setenv("NANOSPEC_PACKED_KERNEL", "onednn")
    out_f, in_f = shape
    gen = torch.Generator().manual_seed(1)
    packed = PackedLinear(nn.Linear(in_f, out_f))
    x = torch.randn(24, in_f, generator=gen)
    with torch.inference_mode():
        alone = torch.cat([packed(x[i:i + 1]) for i in range(24)])
        for n in range(2, 25):
            assert torch.equal(packed(x[:n]), alone[:n]), f"{n} rows"


def test_mkl_packed_rows_do_not_depend_on_how_many_rows_come_with_them(monkeypatch):
    """MKL's packed sgemm computes each row the same way whatever the row count (the reason it is the
    several-row kernel, besides its speed): a node's logits do not change with the tree's size."""
    if not mkl_packed_available():
        pytest.skip("no MKL packed sgemm in this torch build")
    if not mkl_rows_stable():
        assert packed_kernel() == "onednn"  # the engine must not use it here
        pytest.skip("MKL's packed sgemm is not row-stable on this CPU; the engine uses oneDNN's packed kernel")
    monkeypatch.setenv("NANOSPEC_PACKED_KERNEL", "mkl")
    torch.manual_seed(0)
    packed = PackedLinear(nn.Linear(576, 1536))
    x = torch.randn(24, 576)
    with torch.inference_mode():
        full = packed(x)
        for n in (2, 3, 4, 9, 16):
            assert torch.equal(packed(x[:n]), full[:n])
            assert torch.equal(packed(x[n - 2:n]), full[n - 2:n])


def test_packed_rows_is_a_matmul_with_the_rows():
    rows = torch.randn(300, 16)
    h = torch.randn(4, 16)
    with torch.inference_mode():
        torch.testing.assert_close(PackedLinear.from_rows(rows)(h), h @ rows.T, rtol=1e-5, atol=1e-5)


def test_packed_linear_falls_back_to_autograd_when_training():
    lin = nn.Linear(8, 3)
    packed = PackedLinear(lin)
    x = torch.randn(5, 8, requires_grad=True)
    packed(x).sum().backward()
    assert lin.weight.grad is not None and x.grad is not None  # the original Parameter got the gradient
    torch.testing.assert_close(lin.weight.grad, x.detach().sum(0).expand(3, 8))


def test_pack_linears_keeps_tied_weights_and_state_dict():
    target, _ = _tiny()
    keys = set(target.state_dict())
    n_linear = sum(isinstance(m, nn.Linear) for m in target.modules())
    assert pack_linears(target) == n_linear > 0
    assert pack_linears(target) == 0  # idempotent
    assert not any(isinstance(m, nn.Linear) for m in target.modules())
    out_emb = target.get_output_embeddings()
    assert isinstance(out_emb, PackedLinear)
    if target.config.tie_word_embeddings:
        assert out_emb.weight is target.get_input_embeddings().weight
    assert set(target.state_dict()) == keys  # the packed copy is a non-persistent buffer


def test_pack_linears_leaves_other_dtypes_alone():
    model = nn.Sequential(nn.Linear(4, 4).to(torch.float64), nn.Linear(4, 4).to(torch.bfloat16))
    assert pack_linears(model) == 0
    assert all(isinstance(m, nn.Linear) for m in model)


def test_engine_packs_the_pair_and_gives_the_baselines_the_packed_lm_head():
    target, head = _tiny(2)
    frequent = torch.randperm(512, generator=torch.Generator().manual_seed(0))
    engine = SpecEngine(target, None, head, frequent_ids=frequent, eos_token_ids=[])
    assert engine.packed_linears == sum(isinstance(m, PackedLinear) for m in [*target.modules(), *head.modules()])
    full = engine._vocab(GenerationConfig.build("full"))
    static = engine._vocab(GenerationConfig.build("static", static_size=128))
    assert isinstance(full, FullVocab) and full.project is target.get_output_embeddings()
    assert isinstance(static, ActiveVocab) and static._fixed is not None
    h = torch.randn(3, target.config.hidden_size)
    with torch.inference_mode():
        torch.testing.assert_close(full.logits(h), h @ engine.lm_head_weight.T, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(static.logits(h), h @ engine.lm_head_weight[frequent[:128]].T,
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("pack", [True, False])
def test_greedy_lossless_with_and_without_packing(pack):
    target, head = _tiny(4)
    frequent = torch.randperm(512, generator=torch.Generator().manual_seed(1))
    engine = SpecEngine(target, None, head, frequent_ids=frequent, eos_token_ids=[], pack_linears=pack)
    assert (engine.packed_linears > 0) == pack
    g = torch.Generator().manual_seed(5)
    for _ in range(4):
        prompt = torch.randint(0, 512, (9,), generator=g).tolist() * 2
        ref = engine.generate(prompt, method="ar", max_new_tokens=16)
        for method in (m for m in METHODS if m != "ar"):
            out = engine.generate(prompt, method=method, max_new_tokens=16, depth=3, top_k=3, total_tokens=8,
                                  capacity=64, static_size=256, core_size=32)
            assert out.token_ids == ref.token_ids, f"{method} (pack={pack}) diverged"
