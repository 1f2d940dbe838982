"""app: the front door on top of the layers: the `ccs` CLI, `make run`'s command and summary, notebook and UI helpers, result files."""
