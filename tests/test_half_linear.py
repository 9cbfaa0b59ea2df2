"""Half-precision CPU linears: a row's result does not depend on how many rows come with it."""

import torch
import torch.nn as nn

from nanospec.loaders.half_linear import RowStableLinear, rows_differing, stabilize_linears


def test_one_row_equals_the_same_row_in_any_batch():
    # the default pair's MLP down projection (K = 1536), where PyTorch's one-row kernel sums differently on
    # some CPUs; the row-stable linear must give every row the same bits alone as in a batch of 2..24
    assert rows_differing(576, 1536, torch.bfloat16, stable=True, trials=3) == 0


def test_stabilize_swaps_half_cpu_linears_and_keeps_ties():
    torch.manual_seed(0)
    emb = nn.Embedding(40, 32)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 40, bias=False)).to(torch.bfloat16)
    model[2].weight = emb.to(torch.bfloat16).weight  # tied, as an LM head is
    x = torch.randn(3, 16).to(torch.bfloat16)
    with torch.inference_mode():
        before = model(x)
        assert stabilize_linears(model) == 2
        assert stabilize_linears(model) == 0  # idempotent
        assert isinstance(model[0], RowStableLinear) and model[2].weight is emb.weight
        assert torch.equal(model(x), before)
        assert torch.equal(model(x[1:2]), model(x)[1:2])
        assert model(x[0]).shape == (40,)  # a bare vector keeps its shape


def test_fp32_linears_are_left_alone():
    model = nn.Sequential(nn.Linear(8, 8))
    assert stabilize_linears(model) == 0 and isinstance(model[0], nn.Linear)
