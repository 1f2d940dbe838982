"""models: see README.md."""
