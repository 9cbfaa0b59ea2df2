"""Drafters: what proposes the tree. All share one small interface (see `base.Drafter`)."""

from nanospec.drafters.base import Drafter
from nanospec.drafters.eagle import EagleDrafter

__all__ = ["Drafter", "EagleDrafter"]
