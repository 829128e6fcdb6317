"""Package data for the scaling-law toolkit (read with importlib.resources)."""
