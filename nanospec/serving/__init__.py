"""NanoSpec inside a serving engine: the per-request active vocabulary as a vLLM plugin.

`active_sets` is pure torch (the batched sets, their argmax and the head/target check); `vllm_plugin`
imports vLLM only inside `register()`/`install()`, so importing this package never imports vLLM.
Its benchmark is `nanospec.bench.vllm_vocab` (run with the vLLM environment's python).
"""
