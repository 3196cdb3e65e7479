"""Sub-commands of the `memq` CLI, one module per group; each exposes ``register(subparsers)``."""
