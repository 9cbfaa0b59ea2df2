"""Drafters: what proposes the tree. All share one small interface (see `base.Drafter`)."""

from .base import Drafter
from .eagle import EagleDrafter

__all__ = ["Drafter", "EagleDrafter"]
