"""The signed table artifact: binary format and Ed25519 signing."""
