"""Check parameters are typed per check: `--param` is validated against what the selected checks declare, before
any request (a misspelt key names the nearest one; a mistyped value names its type), and `--list-params` lists
them. The plural-key guess is gone: `max_num_seqs=4` is the number 4, `needle_lengths=2000` a list of one."""
from __future__ import annotations

import pytest

from cookbook.checks import CHECKS, selected_checks
from cookbook.checks.params import Param, declared
from cookbook.checks.registry import check_params
from cookbook.cli import main
from cookbook.cli.verify import parse_params
from cookbook.errors import UsageError

CPU = "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_every_key_a_check_reads_is_declared_by_it() -> None:
    """The keys the check modules read (ctx.params.get / param_int) against the declarations: none undeclared."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "cookbook"
    read = set()
    for path in [*root.joinpath("checks").rglob("*.py"), root / "reference" / "_select.py", root / "haystack.py"]:
        text = path.read_text()
        read |= set(re.findall(r"(?:params\.get|param_int\(ctx,|_pick\([A-Z_]+,)\(?\s*\"(\w+)\"", text))
    read -= {"launch_overrides"}  # set by verify --launch itself, never by --param
    assert read >= {"needle_lengths", "max_num_seqs", "seed", "reference", "max_logprob_diff"}, read  # the scan works
    assert read - set(declared(CHECKS.values())) == set()


def test_max_num_seqs_is_a_number_and_a_plural_list_key_a_list() -> None:
    assert parse_params(["max_num_seqs=4"]) == {"max_num_seqs": 4}
    assert parse_params(["needle_lengths=2000", "needle_depths=0.5,0.9", "seed=abc"]) == {
        "needle_lengths": [2000], "needle_depths": [0.5, 0.9], "seed": "abc"}
    assert parse_params(["use_reference=false", "tie_margin=1"]) == {"use_reference": False, "tie_margin": 1.0}


@pytest.mark.parametrize(("item", "checks", "message"), [
    (["max_num_seq=4"], "engine-states", "--param max_num_seq: not a parameter of the checks run; did you mean max_num_seqs?"),
    (["needle_lenghts=2000"], None, "--param needle_lenghts: not a parameter of the checks run; did you mean needle_lengths?"),
    (["max_num_seqs=abc"], None, "--param max_num_seqs: expected a whole number from 1 to 65,536, got 'abc'"),
    (["max_num_seqs=2.5"], None, "--param max_num_seqs: expected a whole number"),
    (["max_num_seqs=1,2"], None, "--param max_num_seqs: expected a whole number"),
    (["needle_depths=2"], None, "--param needle_depths: expected a list (a,b) of numbers from 0 to 1, got '2'"),
    (["concurrency=0"], None, "--param concurrency: expected a whole number from 1 to 4,096"),
    (["use_reference=maybe"], None, "--param use_reference: expected true or false"),
    (["needle_reference=all"], None, "--param needle_reference: expected misses or every-cell"),
    (["needle_lengths=2000"], "core", "--param needle_lengths: read only by needles, which this run does not select"),
])
def test_a_bad_param_is_one_line_naming_the_key(item: list[str], checks: str | None, message: str) -> None:
    specs = selected_checks([checks], None) if checks else None
    with pytest.raises(UsageError) as caught:
        parse_params(item, specs)
    assert str(caught.value).startswith(message), str(caught.value)
    assert "\n" not in str(caught.value)


def test_verify_refuses_a_bad_param_before_any_request(capsys: pytest.CaptureFixture[str]) -> None:
    """Port 9 (discard) is never asked: the error comes first, exit 2."""
    code = main(["verify", CPU, "--base-url", "http://127.0.0.1:9", "--checks", "engine-states",
                 "--param", "max_num_seq=4"])
    assert code == 2
    assert capsys.readouterr().err.strip() == (
        "error: --param max_num_seq: not a parameter of the checks run; did you mean max_num_seqs?")


def test_list_params_names_each_with_type_default_and_checks(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", "--list-params", "--checks", "batch-composition"]) == 0
    out = capsys.readouterr().out
    assert "batch_sizes  (a list (a,b) of whole numbers from 1 to 65,536; default: 2, 4 and --max-num-seqs)" in out
    assert "read by: batch-composition" in out
    assert "needle_lengths" not in out  # only the selected checks' parameters
    assert main(["verify", "--help"]) == 0
    assert "--list-params" in capsys.readouterr().out


def test_calibrate_types_its_params_the_same_way() -> None:
    assert check_params({"batch_sizes": 2}) == {"batch_sizes": [2]}
    with pytest.raises(UsageError, match="--param concurrency: expected a whole number"):
        check_params({"concurrency": "abc"})


def test_a_declaration_is_checked_for_its_kind() -> None:
    seed = Param("seed", "seed", "0", "x")
    assert seed.coerce(7) == 7 and seed.coerce("abc") == "abc"
    with pytest.raises(UsageError):
        seed.coerce(True)
    with pytest.raises(UsageError):
        Param("n", "int list", "-", "x").coerce([])
