"""Imports every check module so that each registers itself (the table order is the registration order).

A module listed here that does not import is an error, never a silent gap in the Verified table.
"""
import importlib

CHECK_MODULES = ("basic", "tools", "sampling", "prefix_cache", "needles", "oracle", "engine_states", "accuracy", "health")

for _name in CHECK_MODULES:
    importlib.import_module(f"{__package__}.{_name}")
