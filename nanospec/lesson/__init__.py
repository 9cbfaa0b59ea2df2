"""Offline job: recording the classroom lesson's traces (`python -m nanospec record-lesson`)."""
