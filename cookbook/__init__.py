"""Gaudi Cookbook: recipes, fixes, a launcher, correctness probes, benchmarks and reports for vLLM."""
__version__ = "0.1.0"
