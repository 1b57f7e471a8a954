"""A reference forward pass: transformers, CPU, fp32. Runs with the image's Python, not the cookbook's.

`cookbook.reference` starts this file as a long-lived subprocess in the image's environment (it has torch and
transformers; the cookbook's own environment never imports them) so that the model loads once per run. It imports
nothing from `cookbook` and has no per-model code: `AutoModelForCausalLM` loads whatever the checkpoint's
config.json names, with the attention layout (sliding windows, hybrid layers) the config declares.

    python -I _reference_forward.py CHECKPOINT_DIR

Protocol: JSON lines. On start it writes one line `{"ready": true, "info": {...}}` (versions, model, device,
dtype). Then for every request line `{"id": N, "prompt_ids": [...], "max_new_tokens": M, "top_k": K}` it writes
`{"id": N, "prompt": [null, [token, logprob, [[id, logprob], ...]], ...], "greedy": [[token, logprob, [...]], ...]}`
where each position is the token's log-softmax (fp32) and the top-K of that position's distribution. A line
`{"id": N, "text": "..."}` is tokenized instead (the checkpoint's own tokenizer, special tokens as the server adds
them): `{"id": N, "tokens": [...]}`. Errors are written as `{"id": N, "error": "..."}` and the process keeps serving.
"""
from __future__ import annotations

import json
import os
import platform
import sys
import time
import traceback

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# Rows of logits turned into log-softmax at a time: the whole prompt's logits stay in fp32, their log-softmax not.
_ROWS = 256


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _positions(torch: "object", logits: "object", chosen: "list[int] | None", top_k: int) -> list:
    """[token, logprob, [[id, logprob] x top_k]] per row of `logits`; `chosen[i]` is the token scored at row i
    (None: the row's own argmax)."""
    out = []
    for start in range(0, logits.shape[0], _ROWS):  # type: ignore[attr-defined]
        block = torch.log_softmax(logits[start : start + _ROWS].float(), dim=-1)  # type: ignore[attr-defined, index]
        values, ids = torch.topk(block, top_k, dim=-1)  # type: ignore[attr-defined]
        for row in range(block.shape[0]):
            top = [[int(i), float(v)] for i, v in zip(ids[row].tolist(), values[row].tolist())]
            token = top[0][0] if chosen is None else int(chosen[start + row])
            out.append([token, float(block[row, token]), top])
    return out


class Forward:
    def __init__(self, checkpoint: str) -> None:
        import torch
        import transformers
        from transformers import AutoConfig, AutoModelForCausalLM

        self.torch = torch
        self._tokenizer = None
        started = time.monotonic()
        config = AutoConfig.from_pretrained(checkpoint)
        self.model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
        self.model.eval()
        self.info = {
            "checkpoint": checkpoint,
            "architecture": (getattr(config, "architectures", None) or [type(self.model).__name__])[0],
            "model_type": getattr(config, "model_type", None),
            "dtype": "float32",
            "device": "cpu",
            "cpu": _cpu_name(),
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": platform.python_version(),
            "attn_implementation": getattr(self.model.config, "_attn_implementation", None),
            "load_s": round(time.monotonic() - started, 2),
        }

    def tokenize(self, text: str) -> list[int]:
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.info["checkpoint"])
        return [int(t) for t in self._tokenizer(text, add_special_tokens=True)["input_ids"]]  # type: ignore[misc]

    def score(self, prompt_ids: list[int], max_new_tokens: int, top_k: int) -> dict:
        torch = self.torch
        with torch.inference_mode():
            ids = torch.tensor([prompt_ids], dtype=torch.long)
            out = self.model(input_ids=ids, use_cache=max_new_tokens > 0)
            logits = out.logits[0]
            prompt = [None] + _positions(torch, logits[:-1], prompt_ids[1:], top_k)
            greedy = []
            past = getattr(out, "past_key_values", None)
            last = logits[-1:]
            del out, logits
            for step in range(max_new_tokens):
                position = _positions(torch, last, None, top_k)[0]
                greedy.append(position)
                if step + 1 == max_new_tokens:
                    break
                nxt = torch.tensor([[position[0]]], dtype=torch.long)
                step_out = self.model(input_ids=nxt, past_key_values=past, use_cache=True)
                past = step_out.past_key_values
                last = step_out.logits[0, -1:]
        return {"prompt": prompt, "greedy": greedy}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: _reference_forward.py CHECKPOINT_DIR", file=sys.stderr)
        return 2
    try:
        forward = Forward(argv[0])
    except Exception as exc:  # the caller reads this line and reports it
        print(json.dumps({"ready": False, "error": f"{type(exc).__name__}: {exc}"}), flush=True)
        return 1
    print(json.dumps({"ready": True, "info": forward.info}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        request_id = None
        try:
            request = json.loads(line)
            request_id = request.get("id")
            started = time.monotonic()
            if "text" in request:
                print(json.dumps({"id": request_id, "tokens": forward.tokenize(str(request["text"]))}), flush=True)
                continue
            result = forward.score(
                [int(t) for t in request["prompt_ids"]], int(request.get("max_new_tokens", 0)), int(request.get("top_k", 5))
            )
            result["id"] = request_id
            result["seconds"] = round(time.monotonic() - started, 3)
            print(json.dumps(result), flush=True)
        except Exception as exc:
            tail = traceback.format_exc().strip().splitlines()[-1]
            print(json.dumps({"id": request_id, "error": f"{type(exc).__name__}: {exc}", "trace": tail}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
