"""`nanospec.bench.long_run`: rows every N tokens, KV size from the model's shape."""

from nanospec import GenerationConfig
from nanospec.bench.long_run import kv_bytes_per_position, measure


def test_measure_reports_every_n_tokens_and_the_kv_size(engine):
    cfg = GenerationConfig.build("nanospec", max_new_tokens=60, depth=3, top_k=4, total_tokens=12)
    cfg.stop_on_eos = False
    rows = measure(engine, list(range(10, 40)), cfg, every=20)
    assert all(r["tokens"] >= 20 * i for i, r in enumerate(rows)) and rows[-1]["tokens"] == 60
    assert len(rows) >= 3
    cfg_m = engine.model.config  # 2 layers, 1 kv head, head dim 32, fp32
    assert kv_bytes_per_position(engine.model) == 2 * cfg_m.num_hidden_layers * 1 * 32 * 4
    assert rows[-1]["kv_mb"] == rows[-1]["positions"] * kv_bytes_per_position(engine.model) / 2**20
    assert rows[-1]["stop_reason"] == "max_new_tokens"
