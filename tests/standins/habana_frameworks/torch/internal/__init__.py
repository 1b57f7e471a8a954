"""CPU stand-in for `habana_frameworks.torch.internal` (see the package docstring): only what tested vllm_gaudi modules use."""
