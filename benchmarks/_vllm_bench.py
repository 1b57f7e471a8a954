"""`vllm bench serve` embedded in one long-lived process of the CPU image, shared by the parity scripts.

The process imports vLLM once, then runs `vllm.benchmarks.serve.main` (the function its CLI calls, with its own
argument parser) for every job line on its stdin and answers with one result line, so that each of its runs sits
right beside ours instead of behind a vLLM import. The client CPU time is read around the main run only: between
the metrics fetched just before it and those fetched just after it. Each script adds its own hooks (what data set
vllm bench samples, what it records) as Python source that defines `prepare(job)` and `finish(result, keep)`.
"""
from __future__ import annotations

import json
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any

from cookbook.image import ImageEnv
from cookbook.progress import end_by_eof

_DRIVER = r"""
import json, sys, time
import vllm.benchmarks.serve as serve
from vllm.utils.argparse_utils import FlexibleArgumentParser

marks = []
def timed(fn):
    async def wrapper(*a, **k):
        marks.append((time.process_time(), time.perf_counter()))
        out = await fn(*a, **k)
        marks.append((time.process_time(), time.perf_counter()))
        return out
    return wrapper

serve.fetch_spec_decode_metrics = timed(serve.fetch_spec_decode_metrics)
serve.fetch_diffusion_metrics = timed(serve.fetch_diffusion_metrics)
"""

_LOOP = r"""
parser = FlexibleArgumentParser()
serve.add_cli_args(parser)
print("COOKBOOK_READY", flush=True)
for line in sys.stdin:
    this_job = json.loads(line)
    marks.clear()
    prepare(this_job)
    result = serve.main(parser.parse_args(this_job["argv"]))
    start, stop = marks[3], marks[4]  # exit of the second fetch before the run, entry of the first after it
    keep = {"client_cpu_s": stop[0] - start[0], "client_wall_s": stop[1] - start[1]}
    finish(result, keep)
    print("COOKBOOK_RESULT " + json.dumps(keep), flush=True)
"""


class EmbeddedVllmBench:
    """One `vllm bench serve` process of the image; `ask(job)` runs one job (its `argv` and whatever the hooks
    read) and returns the result the hooks kept."""

    def __init__(self, image: ImageEnv, hooks: str, prefix: str = "cookbook-parity-") -> None:
        env = image.env()
        env.update({"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"})
        self._folder = tempfile.TemporaryDirectory(prefix=prefix)
        self._log = open(Path(self._folder.name) / "vllm-bench.log", "w+")
        self._proc = subprocess.Popen([str(image.python), "-c", _DRIVER + hooks + _LOOP], env=env, cwd=self._folder.name,
                                      text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log)
        self._expect("COOKBOOK_READY")

    def _expect(self, marker: str) -> str:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            if line.startswith(marker):
                return line[len(marker):].strip()
        self._log.seek(0)
        tail = self._log.read().strip().splitlines()[-8:]
        raise SystemExit("vllm bench serve failed:\n  " + "\n  ".join(tail))

    def ask(self, job: dict[str, Any], timeout_s: float = 900.0) -> dict[str, Any]:
        """One run; the process is killed (and this fails) if it takes longer than `timeout_s`."""
        assert self._proc.stdin is not None
        self._proc.stdin.write(json.dumps(job) + "\n")
        self._proc.stdin.flush()
        watchdog = threading.Timer(timeout_s, self._proc.kill)
        watchdog.start()
        try:
            data: dict[str, Any] = json.loads(self._expect("COOKBOOK_RESULT "))
        finally:
            watchdog.cancel()
        return data

    def close(self) -> None:
        end_by_eof(self._proc)
        self._log.close()
        self._folder.cleanup()
