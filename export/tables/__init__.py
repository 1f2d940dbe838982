"""Building prefix tables: Algorithm 1 aggregation and its metrics."""
