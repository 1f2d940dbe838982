"""The `ccs` commands, one module per area; each defines `register(app)`."""
