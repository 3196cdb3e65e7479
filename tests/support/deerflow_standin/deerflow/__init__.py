"""Stand-in for DeerFlow (see ../README.md): only what a memory backend can observe."""
