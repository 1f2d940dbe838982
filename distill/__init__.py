"""distill: see README.md."""
