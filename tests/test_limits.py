"""A run that reaches the model's context limit ends cleanly with stop reason `context_limit` and says so,
in the engine, the CLI and the app."""

from __future__ import annotations

import shutil

import pytest

import nanospec.__main__ as cli
from app.callbacks import LIVE_OUTPUTS, Explorer
from app.dev.devtools import tiny_loader
from app.models import EngineProvider
from nanospec import STOP_REASONS, stop_message

TREE = dict(depth=3, top_k=4, total_tokens=12)


@pytest.mark.parametrize("method", ["ar", "nanospec"])
def test_engine_stops_at_the_context_limit(engine, method):
    prompt = list(range(100, 400))  # 300 of the fixture model's 512 positions
    run = engine.stream(prompt, method=method, max_new_tokens=400, **TREE)
    result = run.result()
    s = result.summary
    assert s.stop_reason == "context_limit" and s.stop_reason in STOP_REASONS
    assert 0 < s.new_tokens < 400
    # it used the context up to one tree's worth: the next step's tree would not have fit
    length = len(prompt) + s.new_tokens - 1  # the last emitted token is not in the KV cache yet
    slots = TREE["total_tokens"] + (run.config.tree.copy_branch if method != "ar" else 0)  # + the copy chain
    assert run.config.step_slots == slots
    assert length + slots + 1 > engine.max_context >= length
    # and the output is exactly what plain greedy decoding gives for those tokens
    ar = engine.generate(prompt, method="ar", max_new_tokens=s.new_tokens, **TREE)
    assert result.token_ids == ar.token_ids


def test_stop_message_names_the_limit_and_what_to_do():
    msg = stop_message("context_limit", 512)
    assert "context limit of 512 tokens" in msg and "Shorten the prompt" in msg
    assert all(stop_message(r) for r in STOP_REASONS)


def test_cli_prints_the_context_limit_message(monkeypatch, capsys):
    engine, info = tiny_loader(max_positions=96)(None)
    monkeypatch.setattr(cli, "_load", lambda a: (engine, info))
    assert cli.main(["generate", "the draft tree " * 10, "--method", "nanospec", "--max-new-tokens", "200",
                     "--depth", "3", "--top-k", "4", "--total-tokens", "12"]) == 0
    err = capsys.readouterr().err
    assert "stop: context_limit" in err
    assert "note: stopped at the model's context limit of 96 tokens" in err


def test_app_shows_the_context_limit_message():
    explorer = Explorer(EngineProvider(tiny_loader(max_positions=96)))
    outs = list(explorer.run_live("the draft tree " * 10, method="nanospec", max_new_tokens=200, depth=3, top_k=4,
                                  total_tokens=12, progress=lambda *a, **k: None))
    final = dict(zip(LIVE_OUTPUTS, outs[-1]))
    assert final["view"].summary.stop_reason == "context_limit"
    assert "context limit of 96 tokens" in final["kpis"] and 'id="stop-note"' in final["kpis"]


@pytest.mark.parametrize("content,said", [(b"\x89PNG\r\n\x1a\n\x00\x00binary", "is not a text file"),
                                          (b'{"format": "nanospec-trace", "events": [', "is not valid JSON")])
def test_a_junk_upload_gets_a_plain_message(tmp_path, content, said):
    """A file that is not a trace: the page says what it is not and what a trace is, never a codec error."""
    import gradio as gr

    from app.callbacks import Explorer
    from app.dev.devtools import tiny_loader
    from app.models import EngineProvider

    from app.trace import upload_folder

    folder = upload_folder() / f"test-junk-{tmp_path.name}"   # where Gradio puts uploads
    folder.mkdir(parents=True, exist_ok=True)
    junk = folder / "holiday.json"
    junk.write_bytes(content)
    try:
        with pytest.raises(gr.Error) as err:
            Explorer(EngineProvider(tiny_loader())).replay(str(junk))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    message = str(err.value)
    assert said in message and "holiday.json" in message and "Download trace" in message
    assert "codec" not in message and "Expecting" not in message
