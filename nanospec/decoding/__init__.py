"""The decoding core: the engine's steps, the draft tree and its verification, acceptance on the device,
the KV cache, the one host read per step, the context-copy chain and the cost-aware draft budget."""
