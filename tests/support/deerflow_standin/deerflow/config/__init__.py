"""Stand-in for DeerFlow's configuration package (see ../../README.md)."""
