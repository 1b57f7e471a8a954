"""Reproducer for `rank-exception-fatal` (vllm-gaudi v0.26.0, b059f9c; the bug is in vLLM 0.26.0).

vLLM's `WorkerProc.worker_busy_loop` (vllm/v1/executor/multiproc_executor.py) runs every RPC the executor broadcasts;
when the call raises on a rank that does not reply to it (`output_rank` names another rank: `execute_model`,
`sample_tokens`, ... under TP), it logs the exception and dequeues the next call: that rank has skipped a step the
other ranks ran, and the engine keeps serving from out-of-step ranks. The payload's hook is in
vllm_gaudi/v1/worker/hpu_worker.py, which every worker process imports (vLLM resolves `worker_cls` to
`vllm_gaudi.v1.worker.hpu_worker.HPUWorker` in `WorkerProc.__init__`, before the busy loop starts).

This script imports that module (pristine: it installs nothing), then runs vLLM's `WorkerProc.worker_busy_loop` on a
`WorkerProc` made with `object.__new__` that holds a real vLLM shared-memory `MessageQueue` (fed in the executor's
own message format `(method, args, kwargs, output_rank)`) and a real `WorkerWrapperBase` around a small worker whose
`sample_tokens` fails. Each scenario ends with a broadcast callable that raises a BaseException (`EndOfScript`), which
no loop catches. Scenarios: rank 1 of TP=2 (output rank 0), the failure under test; rank 0 (the output rank) and a
call every rank replies to (output_rank None), where the exception must still be handed to `handle_output` and the
loop go on, as upstream. Prints one JSON object (last line).
"""
from __future__ import annotations

import json
import os
import sys
import threading

os.environ.setdefault("VLLM_LOGGING_LEVEL", "CRITICAL")

import cloudpickle  # noqa: E402

import vllm_gaudi.v1.worker.hpu_worker  # noqa: E402,F401  (the worker process imports it; the payload hooks here)
from vllm.distributed.device_communicators.shm_broadcast import MessageQueue  # noqa: E402
from vllm.v1.executor.multiproc_executor import WorkerProc  # noqa: E402
from vllm.v1.worker.worker_base import WorkerWrapperBase  # noqa: E402


class EndOfScript(BaseException):
    """Ends a scenario: a BaseException escapes the loop's `except Exception` whatever the loop does."""


def end_of_script(worker):
    raise EndOfScript()


class StepWorker:
    """A worker whose `sample_tokens` fails at step 1; it records the steps it ran."""

    def __init__(self):
        self.ran: list[str] = []

    def sample_tokens(self, step):
        self.ran.append(f"sample_tokens({step})")
        if step == 1:
            raise RuntimeError("device error in step 1")
        return f"output of step {step}"


def scenario(rank: int, output_rank: int | None) -> dict:
    writer = MessageQueue(1, 1, max_chunk_bytes=1 << 16, max_chunks=8)
    reader = MessageQueue.create_from_handle(writer.export_handle(), 0)
    ready = threading.Thread(target=reader.wait_until_ready)
    ready.start()
    writer.wait_until_ready()
    ready.join()
    for msg in [("sample_tokens", (1,), {}, output_rank), ("sample_tokens", (2,), {}, output_rank),
                (cloudpickle.dumps(end_of_script), (), {}, None)]:
        writer.enqueue(msg)

    proc = object.__new__(WorkerProc)
    proc.rank = rank
    proc.rpc_broadcast_mq = reader
    proc.worker = WorkerWrapperBase(rpc_rank=rank, global_rank=rank)
    proc.worker.worker = step_worker = StepWorker()
    handled: list[str] = []
    proc.handle_output = lambda out: handled.append(repr(out) if isinstance(out, Exception) else str(out))
    try:
        proc.worker_busy_loop()
        ended = "returned"
    except EndOfScript:
        ended = "kept looping until the end of the script"
    except Exception as exc:  # what worker_main catches ("WorkerProc failed."): the rank process then exits
        ended = f"raised {type(exc).__name__}: {exc}"
    return {"rank": rank, "output_rank": output_rank, "ran": step_worker.ran, "handled": handled, "loop": ended}


def main() -> None:
    silent = scenario(rank=1, output_rank=0)
    replying = scenario(rank=0, output_rank=0)
    broadcast = scenario(rank=1, output_rank=None)
    # Upstream behaviour that must stay: a replying rank hands the exception to the executor and goes on.
    expected_replying = {"ran": ["sample_tokens(1)", "sample_tokens(2)"],
                         "handled": ["RuntimeError('device error in step 1')", "output of step 2"],
                         "loop": "kept looping until the end of the script"}
    replying_ok = all(s[k] == v for s in (replying, broadcast) for k, v in expected_replying.items())
    fatal = silent["loop"].startswith("raised RuntimeError") and silent["ran"] == ["sample_tokens(1)"]
    if fatal:
        symptom = f"rank 1 (not the output rank): {silent['loop']}; it ran no later step"
    else:
        symptom = (f"rank 1 (not the output rank) swallowed the exception of sample_tokens(1) (handed to the executor: "
                   f"{silent['handled'] or 'nothing'}) and {silent['loop']}: it ran {', '.join(silent['ran'][1:])}")
    print(json.dumps({"fixed": fatal and replying_ok, "symptom": symptom, "replying_ranks_unchanged": replying_ok,
                      "non_output_rank": silent, "output_rank": replying, "all_ranks_reply": broadcast}))


if __name__ == "__main__":
    main()
    sys.stdout.flush()
