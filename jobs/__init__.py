"""jobs: see README.md."""
