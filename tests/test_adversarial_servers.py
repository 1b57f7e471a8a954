"""Hostile stand-in servers on 127.0.0.1 (issue 15): trickling, stalling, echoing headers, redirecting to another
origin, dying mid-run. Each test is bounded by small timeouts; none needs the real server. No test reads a clock:
a run against a hang is given a budget (the tools' own whole-run deadline, an order of magnitude above what they
need and far below what a hang takes) and must say it ended by the small per-request deadline, never by the
budget."""
from __future__ import annotations

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest

from cookbook.cli import main
from cookbook.results import read_results

SECRET_KEY = "sk-planted-api-key-4242"
URL_PASSWORD = "s3cret-pass-4242"
GENEROUS_S = 60  # the run's budget against a hang: a hang lasts minutes; the tools need seconds


class Hostile:
    """One stand-in server. `mode` says how the OpenAI API (/v1/..., /tokenize) behaves; /health and /v1/models
    answer unless the server is dead."""

    def __init__(self, mode: str, target: str = "", die_after: int = 0) -> None:
        self.mode, self.target, self.die_after = mode, target, die_after
        self.stop = threading.Event()
        self.seen: list[dict[str, Any]] = []
        self.api_calls = 0
        hostile = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _json(self, status: int, body: Any, extra: dict[str, str] | None = None) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (extra or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._handle()

            def do_POST(self) -> None:
                self._handle()

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}") if length else {}
                hostile.seen.append({"path": self.path, "headers": dict(self.headers), "body": body})
                if self.path == "/health":
                    return self._json(200, {})
                if self.path == "/metrics":
                    data = b"process_start_time_seconds 1.0\n"
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    return self.wfile.write(data)
                if self.path == "/v1/models":
                    return self._json(200, {"data": [{"id": "m", "max_model_len": 4096}]})
                hostile.api_calls += 1
                getattr(self, f"_{hostile.mode.replace('-', '_')}")(body)

            def _trickle(self, _body: Any) -> None:  # headers at once, then the body one byte at a time
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "100000")
                self.end_headers()
                while not hostile.stop.wait(0.5):
                    self.wfile.write(b" ")
                    self.wfile.flush()

            def _trickle_headers(self, _body: Any) -> None:  # the status line, then one header byte at a time
                self.wfile.write(b"HTTP/1.1 200 OK\r\nX-Slow: ")
                while not hostile.stop.wait(0.5):
                    self.wfile.write(b"a")
                    self.wfile.flush()

            def _stall(self, _body: Any) -> None:
                hostile.stop.wait()

            def _echo(self, _body: Any) -> None:  # an error body that echoes every request header
                self._json(400, {"error": {"message": f"bad request; you sent {dict(self.headers)}"}})

            def _redirect(self, _body: Any) -> None:
                self.send_response(307)
                self.send_header("Location", hostile.target + self.path)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def _stream(self, body: Any) -> None:  # a streamed chat answer; the server dies after `die_after` of them
                tokens = int(body.get("max_tokens") or 4)
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for i in range(tokens):
                    chunk = {"choices": [{"index": 0, "delta": {"content": f" t{i}"},
                                          "finish_reason": "length" if i == tokens - 1 else None}]}
                    self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                usage = {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": tokens}}
                self.wfile.write(b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n")
                self.wfile.flush()
                self.close_connection = True
                if hostile.die_after and hostile.api_calls >= hostile.die_after:
                    threading.Thread(target=hostile.close, daemon=True).start()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.handle_error = lambda *args: None  # type: ignore[method-assign]  # clients hang up on purpose
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.closed = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.stop.set()
            self.server.shutdown()
            self.server.server_close()


@pytest.fixture
def hostile() -> Iterator[Any]:
    made: list[Hostile] = []

    def make(mode: str, **options: Any) -> Hostile:
        made.append(Hostile(mode, **options))
        return made[-1]

    yield make
    for server in made:
        server.close()


def _verify(url: str, tmp_path: Path, *extra: str) -> tuple[int, Any]:
    out = tmp_path / "verify.json"
    code = main(["verify", "--base-url", url, "--model", "m", "--json", str(out), *extra])
    return code, read_results(out)


def _said(results: Any) -> str:
    return " | ".join([results.stopped or "", *(f"{c.result} {[e.note for e in c.evidence]}" for c in results.checks)])


# -- 4. hangs: every request has a wall-clock deadline, every run a budget -----------------------------------------


@pytest.mark.parametrize("mode", ["trickle", "trickle-headers", "stall"])
def test_a_trickling_or_stalled_server_cannot_hold_a_check(hostile, tmp_path: Path, mode: str) -> None:
    server = hostile(mode)
    code, results = _verify(server.url, tmp_path, "--timeout", "2", "--budget", str(GENEROUS_S),
                            "--checks", "known-answer,seed,min-p,logit-bias")
    assert code == 1 and "budget" not in _said(results), _said(results)  # the 2 s deadlines ended it, not the budget
    by_name = {c.name: c for c in results.checks}
    assert by_name["known-answer"].status == "fail" and "no answer within 2 s" in by_name["known-answer"].result
    assert by_name["known-answer"].details.get("ran_out_of_deadline") is True
    # two checks in a row ran out of their deadline while /health answered: the API hangs, the rest are not run
    assert by_name["logit-bias"].details.get("ran_out_of_deadline") is True  # its /tokenize ran out
    assert by_name["min-p"].status == by_name["seed"].status == "not run"
    assert "no answer within the deadline in 2 checks in a row" in by_name["min-p"].result
    assert "no answer within the deadline" in results.stopped


def test_the_whole_run_has_a_budget(hostile, tmp_path: Path) -> None:
    server = hostile("stall")
    code, results = _verify(server.url, tmp_path, "--timeout", "30", "--budget", "2", "--checks", "known-answer,seed")
    assert code == 1
    first, second = results.checks
    # the budget cut the request in flight: its 30 s timeout is not what ended it
    assert first.status == "fail" and "the run's budget of 2 s ran out" in first.result and "30 s" not in _said(results)
    assert first.details.get("ran_out_of_deadline") is True
    assert second.status == "not run" and "budget of 2 s was used up" in second.result
    assert "budget" in results.stopped


def test_bench_cold_does_not_hang_in_tokenize(hostile, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    server = hostile("trickle")
    out = tmp_path / "bench.json"
    code = main(["bench", "--base-url", server.url, "--model", "m", "--workloads", "cold", "--long-lengths", "200",
                 "--timeout", "2", "--budget", str(GENEROUS_S), "--json", str(out)])
    assert code == 1
    stopped = read_results(out).stopped
    assert "tokenize" in stopped and "2 s" in stopped and "budget" not in stopped, stopped  # its 2 s deadline ended it
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("error: ")


# -- 3. secrets: echoed headers and URL credentials never reach a file or the terminal ----------------------------


def test_an_echoing_server_puts_no_key_in_any_output(hostile, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET_KEY)
    server = hostile("echo")
    code, _ = _verify(server.url, tmp_path, "--timeout", "5", "--checks", "known-answer,top-logprobs")
    bench_json = tmp_path / "bench.json"
    main(["bench", "--base-url", server.url, "--model", "m", "--workloads", "single", "--output-tokens", "4",
          "--timeout", "5", "--json", str(bench_json)])
    assert code == 1
    assert any(h["headers"].get("Authorization") == f"Bearer {SECRET_KEY}" for h in server.seen)  # it was sent
    captured = capsys.readouterr()
    for text in (captured.out, captured.err, (tmp_path / "verify.json").read_text(), bench_json.read_text()):
        assert SECRET_KEY not in text
    assert "***" in (tmp_path / "verify.json").read_text()  # the echoed header is there, masked


def test_url_credentials_are_used_but_never_shown(hostile, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    server = hostile("echo")
    url = server.url.replace("http://", f"http://alice:{URL_PASSWORD}@")
    code, results = _verify(url, tmp_path, "--timeout", "5", "--checks", "known-answer")
    main(["bench", "--base-url", url, "--model", "m", "--workloads", "single", "--output-tokens", "4", "--timeout", "5",
          "--json", str(tmp_path / "bench.json")])
    basic = "Basic " + base64.b64encode(f"alice:{URL_PASSWORD}".encode()).decode()
    assert any(h["headers"].get("Authorization") == basic for h in server.seen if h["path"].startswith("/v1/chat"))
    captured = capsys.readouterr()
    written = (tmp_path / "verify.json").read_text() + (tmp_path / "bench.json").read_text()
    for text in (captured.out, captured.err, written):
        assert URL_PASSWORD not in text and "alice:" not in text
        assert basic.split()[1] not in text
    assert server.url in results.hardware.description or results.hardware.kind


# -- 7. a redirect to another origin is never followed ----------------------------------------------------------


def test_a_redirect_to_another_origin_is_not_followed(hostile, tmp_path: Path) -> None:
    other = hostile("stream")
    server = hostile("redirect", target=other.url)
    code, results = _verify(server.url, tmp_path, "--timeout", "5", "--checks", "known-answer")
    assert code == 1 and other.api_calls == 0
    check = results.checks[0]
    assert check.status == "fail" and check.result == "HTTP 307"
    assert "not followed" in check.evidence[0].note


# -- 5. a server dying mid-benchmark: what was measured is written -------------------------------------------------


def test_bench_keeps_what_it_measured_when_the_server_dies(hostile, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The warm-up, the single stream (also the sweep's first level, read from it) and the sweep's 2-stream level,
    # then it dies during the 4-stream level.
    server = hostile("stream", die_after=4)
    out, plots = tmp_path / "bench.json", tmp_path / "plots"
    code = main(["bench", "--base-url", server.url, "--model", "m", "--workloads", "single,sweep",
                 "--output-tokens", "4", "--streams", "4", "--timeout", "5", "--json", str(out), "--plots", str(plots)])
    assert code == 1
    results = read_results(out)
    assert [f.name for f in results.performance] == ["single-stream", "sweep"]
    assert results.performance[0].failed_requests == 0
    rows = results.performance[1].details["rows"]
    assert [row["streams"] for row in rows] == [1, 2]  # the levels measured are kept
    assert [row["measured_by"] for row in rows] == ["single-stream", "sweep"]
    assert "server" in results.stopped and "sweep" in results.stopped
    assert (plots / "throughput.png").is_file() and results.artifacts["throughput"]
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: ") and "stopped" in err[-1]


@pytest.mark.parametrize("flag", ["--json", "--plots"])
@pytest.mark.parametrize("where", ["a directory", "under a file"])
def test_unwritable_outputs_fail_before_any_request(hostile, tmp_path: Path, flag: str, where: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    server = hostile("stream")
    (tmp_path / "file").write_text("x")
    (tmp_path / "dir").mkdir()
    target = {"a directory": tmp_path / "dir", "under a file": tmp_path / "file" / "out"}[where]
    if flag == "--plots" and where == "a directory":
        target = tmp_path / "file"  # a plots folder that is a file
    argv = ["bench", "--base-url", server.url, "--model", "m", "--workloads", "single", "--output-tokens", "4", flag, str(target)]
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith(f"error: {flag}: ") and server.api_calls == 0, err


def test_verify_json_that_is_a_directory_fails_before_any_check(hostile, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    server = hostile("stream")
    code = main(["verify", "--base-url", server.url, "--model", "m", "--json", str(tmp_path), "--checks", "known-answer"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("error: --json: ") and server.api_calls == 0


# -- 1. a batch run with TOKENIZERS_PARALLELISM=false and a planted token: every file stays valid, no token -------


def test_a_batch_run_folder_stays_valid_json_and_holds_no_secret(hostile, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import nbformat

    from cookbook import batch
    from cookbook.recipes import load_recipe
    from test_batch import WRITES_PART, make_notebook

    token = "hf_planted_batch_token_77"
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    monkeypatch.setenv("HF_TOKEN", token)
    server = hostile("stream")
    books = tmp_path / "books"
    books.mkdir()
    code = WRITES_PART.format(name="first") + f'\nprint({{"ok": True, "echo": "Bearer {token}", "flag": False}})'
    source = make_notebook(books, "01_first", code)
    url = server.url.replace("http://", "http://alice:pw@")
    summary = batch.run_batch(load_recipe("HuggingFaceTB/SmolLM2-135M-Instruct"), url, tmp_path / "run", [source],
                              say=lambda _line: None)
    assert summary.ok, summary.notebooks
    run = tmp_path / "run"
    for path in run.rglob("*"):
        if not path.is_file():
            continue
        data = path.read_bytes()
        assert token.encode() not in data and b"alice:pw" not in data, path
        if path.suffix in (".json", ".ipynb"):
            json.loads(data)  # every JSON file (results, parts, summary, notebook) is still valid
    results = read_results(run / "results.json")
    assert results.checks[0].status == "pass"  # `false`/`true` were never masked
    executed = nbformat.read(str(run / "01_first.ipynb"), as_version=4)
    assert "'flag': False" in str(executed.cells[-1].outputs)
