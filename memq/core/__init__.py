"""The bottom layer: settings, shared models, identifiers, Redis keys and errors."""
