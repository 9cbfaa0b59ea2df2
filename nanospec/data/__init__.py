"""Offline data: token-frequency tables and the project's prompt set."""
