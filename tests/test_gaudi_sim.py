"""The reproducers' fork server (tests/_repro_zygote.py, tests/gaudi_sim.py `Zygote`) runs a script as a fresh
interpreter would, and fails where a shared interpreter could lie: a `vllm_gaudi` module from outside the run's
overlay, a crash, a run past its time. Each case is a real run in the simulated image."""
from __future__ import annotations

from pathlib import Path

import pytest

from gaudi_sim import overlay

pytestmark = pytest.mark.sim_image


def _script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "probe.py"
    path.write_text(body)
    return path


def test_a_run_imports_vllm_gaudi_from_its_own_overlay(sim_image, tmp_path: Path) -> None:
    site = overlay(sim_image, tmp_path / "site")
    script = _script(tmp_path, "import sys, vllm_gaudi.v1.worker.hpu_input_batch as m\nprint(m.__file__)\n"
                               "print(sys.argv[0])\n")
    code, out, err = sim_image.zygote().run(script, site, 120)
    assert code == 0, err
    module_file, argv0 = out.strip().splitlines()[-2:]
    assert module_file.startswith(str(site)), module_file
    assert argv0 == str(script)
    code, out, err = sim_image.zygote().run(script, None, 120)
    assert code == 0, err
    assert out.strip().splitlines()[-2].startswith(str(sim_image.site))


def test_a_vllm_gaudi_module_from_outside_the_overlay_fails_the_run(sim_image, tmp_path: Path) -> None:
    empty = tmp_path / "empty-overlay"
    empty.mkdir()
    script = _script(tmp_path, "import vllm_gaudi\nprint('{}')\n")
    code, _, err = sim_image.zygote().run(script, empty, 120)
    assert code == 97, err
    assert "vllm_gaudi imported from outside" in err


def test_each_run_is_a_fresh_child(sim_image, tmp_path: Path) -> None:
    """What one run changes (environment, modules, globals) the next never sees."""
    script = _script(tmp_path, "import os, sys, vllm.sampling_params as sp\n"
                               "print(os.environ.get('COOKBOOK_PROBE'), hasattr(sp, 'cookbook_probe'))\n"
                               "os.environ['COOKBOOK_PROBE'] = 'set'; sp.cookbook_probe = 1\n")
    for _ in range(2):
        code, out, err = sim_image.zygote().run(script, None, 120)
        assert code == 0, err
        assert out.strip().splitlines()[-1] == "None False"


def test_a_crash_and_a_hang_fail_with_why(sim_image, tmp_path: Path) -> None:
    code, _, err = sim_image.zygote().run(_script(tmp_path, "raise ValueError('planted')\n"), None, 120)
    assert code == 1 and "ValueError: planted" in err
    code, _, err = sim_image.zygote().run(_script(tmp_path, "import sys\nsys.exit(3)\n"), None, 120)
    assert code == 3
    code, _, err = sim_image.zygote().run(_script(tmp_path, "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n"),
                                          None, 120)
    assert code == -1 and "the child died" in err
    with pytest.raises(AssertionError, match="ran over 2 s and was killed"):
        sim_image.zygote().run(_script(tmp_path, "import time\ntime.sleep(60)\n"), None, 2)
