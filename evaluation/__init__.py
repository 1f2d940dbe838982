"""evaluation: research evaluation of the classifier and of CC policies (cross-node evaluation, in-memory experiment, emulation, A/B analysis)."""
