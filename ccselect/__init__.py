"""ccselect: per-prefix TCP congestion-control selection for CDN edges (ALICCS, NSDI'25)."""

__version__ = "0.1.0"
