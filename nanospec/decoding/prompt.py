"""A request's text side: prompts (text or chat turns) to token ids, and the ids that end a generation."""

from __future__ import annotations


def encode_text(tokenizer, prompt: str | list[dict], chat: bool | None = None) -> list[int]:
    """Text or chat turns -> ids; the chat template is applied when the tokenizer has one (or `chat`
    says so). Raises ValueError for an empty prompt, malformed turns or a missing tokenizer."""
    if isinstance(prompt, str):
        if not prompt.strip():
            raise ValueError("prompt must be a non-empty string")
        messages = [{"role": "user", "content": prompt}]
    elif isinstance(prompt, list) and prompt and all(isinstance(m, dict) and "content" in m for m in prompt):
        messages = prompt
        if not any(str(m["content"]).strip() for m in messages):
            raise ValueError("prompt must contain at least one non-empty turn")
    else:
        raise ValueError("prompt must be a non-empty string or a list of {'role', 'content'} turns")
    if tokenizer is None:
        raise ValueError("this engine has no tokenizer: pass token ids to stream()/generate()")
    use_chat = chat if chat is not None else bool(getattr(tokenizer, "chat_template", None))
    if use_chat:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return list(ids)
    if not isinstance(prompt, str):
        raise ValueError("chat turns need a tokenizer with a chat template")
    return tokenizer(prompt)["input_ids"]


def eos_ids(model, tokenizer) -> list[int]:
    """Every EOS id the model's generation config, its config and the tokenizer name, sorted."""
    ids = []
    for src in (getattr(model, "generation_config", None), model.config, tokenizer):
        eos = getattr(src, "eos_token_id", None) if src is not None else None
        if isinstance(eos, int):
            ids.append(eos)
        elif isinstance(eos, (list, tuple)):
            ids.extend(int(e) for e in eos)
    return sorted(set(ids))
