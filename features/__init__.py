"""features: see README.md."""
