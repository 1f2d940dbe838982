"""The edge: the eBPF enforcer, the ccs-edge agent (C) and their Python wrapper and probe."""
