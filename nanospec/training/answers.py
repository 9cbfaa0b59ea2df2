"""The resumable answer-generation job: the target's own answers to the prompt pool, in committed chunks.

    python -m nanospec.training.answers generate --out train_data/smollm2-135m --minutes 60
    python -m nanospec.training.answers status --out train_data/smollm2-135m

Each step takes the next ``window`` prompts of the pool (:mod:`.prompt_pool`) from the manifest's
cursor, generates the target's greedy answer to each (length-sorted batches, left padding, the chat
template) and a sampled one to every ``sample_every``-th, and keeps them in memory; every
``chunk_answers`` answers or ``chunk_minutes`` minutes they become one chunk (:mod:`.answer_chunks`)
and the cursor moves past them. A killed job loses only the answers since the last chunk; SIGTERM or
Ctrl-C writes them first. Runs at niceness 19 with ``threads`` torch threads.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from nanospec.training.answer_chunks import (AnswerRecord, read_manifest, target_fingerprint, tokenizer_fingerprint,
                                             write_chunk, write_manifest)
from nanospec.training.background import (Deadline, StopFlag, config_from_args, lower_priority,
                                          parser_from_dataclass)
from nanospec.training.prompt_pool import FAMILY_WEIGHTS, PART_SIZE, PromptPool

# settings that define the data: a folder's chunks are all made with the same ones
DATA_SETTINGS = ("seed", "part_size", "max_new_tokens", "max_prompt_tokens", "sample_every", "temperature", "top_p")


@dataclass
class GenerateConfig:
    out: str = field(default="", metadata={"help": "data folder (chunks, manifest, prompt pool)", "required": True})
    minutes: float = field(default=60.0, metadata={"help": "wall-clock budget; <= 0 = until stopped"})
    model: str = field(default="", metadata={"help": "target ('' = the offline SmolLM2-135M-Instruct)"})
    seed: int = field(default=0, metadata={"help": "prompt pool and sampling seed"})
    part_size: int = field(default=PART_SIZE, metadata={"help": "prompts per frozen pool part"})
    window: int = field(default=96, metadata={"help": "prompts per step (length-sorted into batches)"})
    gen_batch: int = field(default=32, metadata={"help": "sequences per generate call"})
    max_new_tokens: int = field(default=128, metadata={"help": "answer length cap"})
    max_prompt_tokens: int = field(default=640, metadata={"help": "longer prompts are skipped (counted)"})
    sample_every: int = field(default=3, metadata={"help": "every k-th prompt also gets a sampled answer (0 = none)"})
    temperature: float = field(default=0.7, metadata={"help": "sampled answers' temperature"})
    top_p: float = field(default=0.95, metadata={"help": "sampled answers' nucleus"})
    chunk_answers: int = field(default=2048, metadata={"help": "answers per chunk"})
    chunk_minutes: float = field(default=20.0, metadata={"help": "write a chunk at least this often"})
    max_prompts: int = field(default=0, metadata={"help": "stop after this many more prompts; 0 = no limit"})
    threads: int = field(default=2, metadata={"help": "torch CPU threads"})
    pid_file: str = field(default="", metadata={"help": "write this process's id here (to pause it: kill -STOP)"})

    def __post_init__(self):
        if (self.window < 1 or self.gen_batch < 1 or self.max_new_tokens < 2 or self.max_prompt_tokens < 8
                or self.sample_every < 0 or self.chunk_answers < 1 or self.part_size < 1 or self.threads < 1):
            raise ValueError("window, gen_batch, chunk_answers, part_size, threads must be >= 1, max_new_tokens "
                             ">= 2, max_prompt_tokens >= 8, sample_every >= 0")
        if not (self.temperature > 0 and 0 < self.top_p <= 1):
            raise ValueError(f"temperature must be > 0 and top_p in (0, 1], got {self.temperature}, {self.top_p}")

    def data_settings(self) -> dict:
        return {k: getattr(self, k) for k in DATA_SETTINGS}


# ---- the manifest ---------------------------------------------------------------------------------


def open_manifest(folder: Path, cfg: GenerateConfig, target_hash: str, tokenizer_hash: str, target_name: str) -> dict:
    """The folder's manifest, or a new one; ValueError if the folder was made by another target,
    tokenizer or data settings (a new folder is needed then)."""
    manifest = read_manifest(folder)
    if manifest is None:
        return {"format": 1, "target": target_name, "target_hash": target_hash, "tokenizer": tokenizer_hash,
                "settings": cfg.data_settings(), "sources": list(FAMILY_WEIGHTS), "cursor": 0,
                "skipped_prompts": 0, "chunks": [], "runs": []}
    if manifest.get("tokenizer") != tokenizer_hash or manifest.get("target_hash") != target_hash:
        raise ValueError(f"{folder}: made with another target or tokenizer ({manifest.get('target')}, tokenizer "
                         f"{manifest.get('tokenizer')}); use another --out for this one")
    differ = {k: (v, manifest["settings"].get(k)) for k, v in cfg.data_settings().items()
              if manifest["settings"].get(k) != v}
    if differ:
        raise ValueError(f"{folder}: made with other data settings (yours, the folder's): {differ}; "
                         "use the folder's settings or another --out")
    return manifest


def totals(manifest: dict) -> dict:
    chunks = manifest["chunks"]
    return {k: sum(c[k] for c in chunks) for k in ("answers", "sampled", "tokens", "answer_tokens", "bytes")}


# ---- generation -----------------------------------------------------------------------------------


def encode_prompts(tokenizer, pool: PromptPool, indices: range, cfg: GenerateConfig,
                   sources: list[str]) -> tuple[list[tuple[int, int, list[int]]], int]:
    """-> ([(pool index, source id, prompt ids)], prompts skipped as too long)."""
    out, skipped = [], 0
    for i in indices:
        item = pool.item(i)
        text = tokenizer.apply_chat_template(item["messages"], add_generation_prompt=True, tokenize=False)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) > cfg.max_prompt_tokens:
            skipped += 1
            continue
        out.append((i, sources.index(item["source"]), ids))
    return out, skipped


def left_pad(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """-> input_ids [B, P], attention_mask [B, P] with the padding on the left."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, p in enumerate(prompts):
        ids[row, width - len(p):] = torch.tensor(p)
        mask[row, width - len(p):] = 1
    return ids, mask


@torch.inference_mode()
def generate_records(model, jobs: list[tuple[int, int, list[int]]], cfg: GenerateConfig, eos: int,
                     sampled: bool) -> list[AnswerRecord]:
    """The target's answers to `jobs` (greedy, or sampled with the config's temperature and top-p)."""
    jobs = sorted(jobs, key=lambda j: len(j[2]))
    extra = dict(do_sample=True, temperature=cfg.temperature, top_p=cfg.top_p, top_k=0) if sampled \
        else dict(do_sample=False)
    records = []
    for b in range(0, len(jobs), cfg.gen_batch):
        batch = jobs[b:b + cfg.gen_batch]
        ids, mask = left_pad([j[2] for j in batch], eos)
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=cfg.max_new_tokens,
                             eos_token_id=eos, pad_token_id=eos, **extra)
        for (index, source, prompt), row in zip(batch, out[:, ids.shape[1]:].tolist()):
            end = row.index(eos) + 1 if eos in row else len(row)
            if end < 2:
                continue
            records.append(AnswerRecord(prompt + row[:end], len(prompt), index, sampled, eos in row, source))
    return records


def answer_window(model, tokenizer, pool: PromptPool, indices: range, cfg: GenerateConfig, sources: list[str],
                  eos: int) -> tuple[list[AnswerRecord], int]:
    jobs, skipped = encode_prompts(tokenizer, pool, indices, cfg, sources)
    records = generate_records(model, jobs, cfg, eos, sampled=False)
    picked = [j for j in jobs if cfg.sample_every and j[0] % cfg.sample_every == 0]
    if picked:
        torch.manual_seed(cfg.seed * 1_000_003 + indices.start)   # reproducible for a given window
        records += generate_records(model, picked, cfg, eos, sampled=True)
    return records, skipped


def flush(folder: Path, manifest: dict, pending: list[AnswerRecord], cursor: int, skipped: int,
          seconds: float, log) -> None:
    """Write the pending answers as the next chunk, then the manifest that lists it and the new cursor."""
    name = f"answers-{len(manifest['chunks']):05d}.npz"
    entry = write_chunk(folder, name, pending, manifest["tokenizer"])
    entry["seconds"] = round(seconds, 1)
    entry["written"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    manifest["chunks"].append(entry)
    manifest["cursor"] = cursor
    manifest["skipped_prompts"] += skipped
    manifest["totals"] = totals(manifest)
    write_manifest(folder, manifest)
    log(f"chunk {name}: {entry['answers']} answers, {entry['bytes'] / 2**20:.2f} MiB; cursor {cursor}; "
        f"{manifest['totals']['answers']} answers in {len(manifest['chunks'])} chunks")


def run_generation(cfg: GenerateConfig, model, tokenizer, target_name: str, log=print,
                   stop: StopFlag | None = None, pools=None) -> dict:
    """Generate until the budget is spent or `stop` is set; returns the manifest. `pools`: the real-text
    pools for new prompt-pool parts (None: read from this machine, see :func:`.prompt_pool.build_part`)."""
    folder = Path(cfg.out)
    folder.mkdir(parents=True, exist_ok=True)
    manifest = open_manifest(folder, cfg, target_fingerprint(model), tokenizer_fingerprint(tokenizer), target_name)
    eos = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)
    pool = PromptPool(folder, cfg.seed, cfg.part_size, log, pools)
    deadline, stop = Deadline(cfg.minutes), stop or StopFlag()
    pending, skipped, cursor = [], 0, manifest["cursor"]
    t_chunk = t_run = time.monotonic()
    answers0 = totals(manifest)["answers"]
    run = {"started": time.strftime("%Y-%m-%dT%H:%M:%S"), "from_cursor": cursor, "gen_batch": cfg.gen_batch,
           "window": cfg.window}
    start = cursor
    while not deadline.passed() and not stop.set and not (cfg.max_prompts and cursor - start >= cfg.max_prompts):
        t0 = time.monotonic()
        records, n_skip = answer_window(model, tokenizer, pool, range(cursor, cursor + cfg.window), cfg,
                                        manifest["sources"], eos)
        pending, skipped, cursor = pending + records, skipped + n_skip, cursor + cfg.window
        done = totals(manifest)["answers"] + len(pending)
        rate = 3600 * (done - answers0) / max(time.monotonic() - t_run, 1.0)
        log(f"prompts {cursor - cfg.window}-{cursor}: {len(records)} answers in {time.monotonic() - t0:.0f} s; "
            f"{len(pending)} pending; {done} in all; {rate:.0f} answers/h this run")
        if len(pending) >= cfg.chunk_answers or time.monotonic() - t_chunk >= cfg.chunk_minutes * 60:
            flush(folder, manifest, pending, cursor, skipped, time.monotonic() - t_chunk, log)
            pending, skipped, t_chunk = [], 0, time.monotonic()
    if pending:
        flush(folder, manifest, pending, cursor, skipped, time.monotonic() - t_chunk, log)
    run.update(ended=time.strftime("%Y-%m-%dT%H:%M:%S"), to_cursor=cursor, stopped_by=stop.reason or "budget")
    manifest["runs"].append(run)
    write_manifest(folder, manifest)
    return manifest


# ---- CLI ----------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m nanospec.training.answers", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    parser_from_dataclass(GenerateConfig, "", "", sub.add_parser("generate", help="generate (resumes)"))
    status = sub.add_parser("status", help="print the folder's totals and check every chunk")
    status.add_argument("--out", required=True)
    return p


def status(folder: Path) -> dict:
    from nanospec.training.answer_chunks import iter_chunks

    manifest = read_manifest(folder)
    if manifest is None:
        raise ValueError(f"{folder}: no manifest.json (not an answer folder, or nothing written yet)")
    readable = sum(len(c) for c in iter_chunks(folder, manifest.get("tokenizer")))
    return {"cursor": manifest["cursor"], "chunks": len(manifest["chunks"]), **totals(manifest),
            "readable_answers": readable, "skipped_prompts": manifest["skipped_prompts"]}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "status":
            print(json.dumps(status(Path(args.out)), indent=1))
            return 0
        return generate(config_from_args(GenerateConfig, args))
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


def generate(cfg: GenerateConfig) -> int:
    nice = lower_priority(cfg.threads)
    if cfg.pid_file:
        Path(cfg.pid_file).write_text(f"{os.getpid()}\n")
    from nanospec.loaders.loading import load_target

    loaded = load_target(cfg.model or None, device="cpu", dtype="float32")
    log = lambda m: print(f"[{time.strftime('%H:%M:%S')}] {m}", flush=True)
    log(f"answers job: pid {os.getpid()}, niceness {nice}, {cfg.threads} threads, settings {dataclasses.asdict(cfg)}")
    with StopFlag() as stop:
        manifest = run_generation(cfg, loaded.model, loaded.tokenizer, loaded.name, log, stop)
    log(f"stopped ({manifest['runs'][-1]['stopped_by']}): {json.dumps(totals(manifest))}, cursor {manifest['cursor']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
