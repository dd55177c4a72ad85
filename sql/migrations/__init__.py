"""The schema as ordered migrations; ``manifest.toml`` holds the released ones' checksums."""
