"""Delivering tables: the artifact store, guards, publish and the canary-first rollout."""
