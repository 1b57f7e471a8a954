"""CPU stand-in for Intel Gaudi's `habana_frameworks` package, laid into the simulated v0.26.0 image only.

The real package ships with the Gaudi software (`habana-torch-plugin`) and exists only on a Gaudi host. This one holds
nothing but the symbols that the vllm_gaudi modules the cookbook's tests import reach for, each documented as a CPU
stand-in: it lets real b059f9c code import and run its host-side logic on a CPU. It is never a result, never a device.
"""
