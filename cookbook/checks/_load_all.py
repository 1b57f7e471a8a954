"""Imports every check module so that each registers itself (the table order is the registration order)."""
import importlib

for _name in ("basic", "tools", "sampling", "prefix_cache", "needles", "oracle", "engine_states", "health"):
    try:
        importlib.import_module(f"{__package__}.{_name}")
    except ModuleNotFoundError as exc:  # a check module still being written
        if exc.name != f"{__package__}.{_name}":
            raise
