"""Offline job: training the draft head (data, model and loss, loop, evaluation, CLI)."""
