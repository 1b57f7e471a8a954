"""The reproducers' fork server, run by the simulated image's own interpreter (tests/gaudi_sim.py starts it).

A reproducer is a fresh interpreter that spends about 11 of its 14 seconds importing torch and vLLM. This process
imports vLLM's modules the reproducers share once (never vllm_gaudi: the pristine and the patched runs must each
import their own), then forks one child per job. The child is the run: it puts the job's overlay ahead of the
image's site-packages, sets the job's environment, runs the script as `__main__` with its stdout and stderr in the
job's files, checks that every vllm_gaudi module it imported came from where the job said, and writes its exit
code last (`<job>.rc`). A job line on stdin is answered at once with the child's pid; the caller waits for the rc
file. EOF on stdin ends the server (running children finish on their own).
"""
import json
import os
import runpy
import signal
import sys
import traceback

# The environment is SimImage.run's, as every reproducer gets it; most reproducers quiet vLLM's logger before they
# import it, and a logger configured here stays configured in the children.
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

import numpy  # noqa: E402,F401
import torch  # noqa: E402,F401
import vllm.config  # noqa: E402,F401
import vllm.sampling_params  # noqa: E402,F401
import vllm.v1.core.sched.output  # noqa: E402,F401
import vllm.v1.engine  # noqa: E402,F401
import vllm.v1.outputs  # noqa: E402,F401
import vllm.v1.request  # noqa: E402,F401
import vllm.v1.sample.sampler  # noqa: E402,F401

PRELOADED_GAUDI = sorted(m for m in sys.modules if m.split(".")[0] == "vllm_gaudi")


def _run_child(job: dict) -> None:
    """In the forked child: the reproducer, as a fresh interpreter would run it. Never returns."""
    code = 1
    try:
        out = os.open(job["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        err = os.open(job["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(out, 1)
        os.dup2(err, 2)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.environ.clear()
        os.environ.update(job["env"])
        if job.get("overlay"):
            sys.path.insert(0, job["overlay"])
        sys.argv = [job["script"]]
        try:
            runpy.run_path(job["script"], run_name="__main__")
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:
            traceback.print_exc()
            code = 1
        expected = job.get("overlay") or job["site"]
        stray = [f"{name} from {mod.__file__}" for name, mod in list(sys.modules.items())
                 if name.split(".")[0] == "vllm_gaudi" and getattr(mod, "__file__", None)
                 and not os.path.realpath(mod.__file__).startswith(os.path.realpath(expected) + os.sep)]
        if stray:
            print(f"zygote: vllm_gaudi imported from outside {expected}: {stray[:3]}", file=sys.stderr)
            code = 97
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            with open(job["rc"] + ".tmp", "w") as rc:
                rc.write(str(code))
            os.rename(job["rc"] + ".tmp", job["rc"])
            os._exit(code)


def main() -> None:
    if PRELOADED_GAUDI:
        print(f"zygote: the preload imported {PRELOADED_GAUDI[:3]}; pristine and patched runs would share it", flush=True)
        sys.exit(2)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel; the rc file is the result
    print("ZYGOTE_READY", flush=True)
    for line in sys.stdin:
        job = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _run_child(job)
        print(json.dumps({"pid": pid}), flush=True)


if __name__ == "__main__":
    main()
