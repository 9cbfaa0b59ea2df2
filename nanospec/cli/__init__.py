"""The `nanospec` command's parts: its flags, built from the run-option table (`flags`), and its one
report printer (`report`). The subcommands themselves are in `nanospec/__main__.py`."""
