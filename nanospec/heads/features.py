"""EAGLE-3's target features: the hidden states entering three target layers, captured by hooks.

EAGLE-3 reads a low, a middle and a high hidden state of the target: the states *entering*
layers 2, L//2 and L-3 (L = number of decoder layers), i.e. indices 2, L//2 and L-3 of
transformers' ``output_hidden_states`` tuple (index 0 is the embedding output, index i the input
of layer i). Asking the model for ``output_hidden_states`` keeps all L+1 states alive; a forward
pre-hook on each of the three layers keeps only those three, for any forward call (prefill,
decoding, tree verification, ``generate``).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch


def eagle3_layer_ids(num_layers: int) -> tuple[int, int, int]:
    """(2, L//2, L-3): the hidden-state indices EAGLE-3 fuses (low, middle, high)."""
    if num_layers < 6:
        raise ValueError(f"EAGLE-3 needs a target with at least 6 decoder layers, got num_hidden_layers={num_layers}")
    return 2, num_layers // 2, num_layers - 3


def decoder_layers(model) -> torch.nn.ModuleList:
    """The decoder layer list of a transformers causal LM (``model.model.layers``)."""
    inner = getattr(model, "model", model)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__} has no .model.layers; EAGLE-3 features need a decoder-only LM")
    return layers


class FeatureRecorder:
    """Records the inputs of the chosen decoder layers on every forward call while attached.

    ``take()`` returns the concatenation [B, q, 3H] of the three states of the latest forward call
    (in low, middle, high order) and clears the buffer; ``history()`` returns every call's
    concatenation (for ``generate``)."""

    def __init__(self, model, layer_ids: tuple[int, ...] | None = None, keep_history: bool = False):
        layers = decoder_layers(model)
        self.layer_ids = tuple(layer_ids) if layer_ids is not None else eagle3_layer_ids(len(layers))
        if any(i < 0 or i >= len(layers) for i in self.layer_ids):
            raise ValueError(f"feature layer ids {self.layer_ids} must lie in 0..{len(layers) - 1}")
        self._layers = layers
        self._current: dict[int, torch.Tensor] = {}
        self._keep = keep_history
        self._history: list[torch.Tensor] = []
        self._handles: list = []

    def _hook(self, index: int):
        def record(module, args, kwargs):
            state = args[0] if args else kwargs["hidden_states"]
            self._current[index] = state.detach()
            if self._keep and index == self.layer_ids[-1]:
                self._history.append(self._join())
        return record

    def _join(self) -> torch.Tensor:
        return torch.cat([self._current[i] for i in self.layer_ids], dim=-1)

    def attach(self) -> "FeatureRecorder":
        if not self._handles:
            for i in dict.fromkeys(self.layer_ids):
                self._handles.append(self._layers[i].register_forward_pre_hook(self._hook(i), with_kwargs=True))
        return self

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def take(self) -> torch.Tensor:
        if set(self._current) != set(self.layer_ids):
            raise RuntimeError("no target forward call was recorded since the last take()")
        out = self._join()
        self._current = {}
        return out

    def history(self) -> list[torch.Tensor]:
        out, self._history = self._history, []
        return out


@contextmanager
def recording(model, layer_ids: tuple[int, ...] | None = None, keep_history: bool = False
              ) -> Iterator[FeatureRecorder]:
    """``with recording(model) as rec: model(ids); f = rec.take()`` - hooks removed on exit."""
    rec = FeatureRecorder(model, layer_ids, keep_history).attach()
    try:
        yield rec
    finally:
        rec.detach()
