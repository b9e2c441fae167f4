"""launchers/gpu_check.py without a GPU: its CPU dry run runs every code path of the GPU
check on tiny shapes and passes every check; without the flag it refuses with code 2; and
nothing it imports, on either model path, pulls in vLLM, Monarch or NIXL (the GPU machine
has none of them)."""

import json
import subprocess
import sys

import pytest
import torch

from launchers import gpu_check
from pivot.paths import REPO_ROOT

SCRIPT = REPO_ROOT / "launchers" / "gpu_check.py"

BLOCKING_RUN = """
import importlib.abc, json, runpy, sys
BLOCKED = {blocked!r}
tried = []
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            tried.append(name)
            raise ImportError(f"{{name}} is blocked: the GPU machine does not have it")
        return None
sys.meta_path.insert(0, Block())
sys.argv = ["gpu_check.py", "--cpu_dry_run", "--out", {out!r}]
try:
    runpy.run_path({script!r}, run_name="__main__")
except SystemExit as e:
    code = e.code
loaded = sorted({{m.split(".")[0] for m in sys.modules}} & BLOCKED)
print("IMPORTS " + json.dumps({{"tried": tried, "loaded": loaded, "code": code}}))
"""


def test_dry_run_runs_every_check_and_passes(tmp_path):
    out = tmp_path / "check.json"
    assert gpu_check.main(["--cpu_dry_run", "--out", str(out), "--repeats", "2"]) == 0
    res = json.loads(out.read_text())
    assert res["mode"] == "cpu_dry_run" and res["passed"] is True
    assert set(res["checks"]) >= {
        "peak_copy_right", "read_bit_exact[tiny]", "bit_exact[param]", "bit_exact[grad]",
        "bit_exact[opt]", "all_tensor_storage_freed", "next_step_loss_equal",
        "next_step_params_equal", "gps_read_bit_exact[tiny]", "gps_arenas_registered[tiny]"}
    gps = res["gps"]["models"][0]
    # the product's GPS client and transport: a Write and Reads of every byte, nothing
    # registered with a CUDA driver on the CPU
    assert gps["bytes"] == 2 * read_params(res) and gps["registered_bytes"] == 0
    g = res["grpo_shift"]
    assert g["implementation"].startswith("torchtitan")
    assert g["offload"]["bytes"] == g["reload"]["bytes"] == g["offload"]["tensor_bytes_before"]
    # params + grads + two AdamW moments, fp32 (tied embedding counted once), + step counters
    assert g["offload"]["bytes"] >= 4 * 4 * g["params"]
    assert g["offload"]["tensor_bytes_after"] == 0
    assert g["step2_loss_after_reload"] == g["step2_loss_no_offload"]
    read = res["bandwidth"]["reads"][0]
    assert read["bytes"] == 2 * read["params"] and read["sliced_read"]["best_gbps"] > 0
    assert not torch.are_deterministic_algorithms_enabled()  # the setting is put back


def read_params(res: dict) -> int:
    return res["bandwidth"]["reads"][0]["params"]


def test_a_broken_round_trip_fails_the_check(tmp_path, monkeypatch):
    """The checks can fail: a reload that flips one exponent bit of the first weight (the
    tied embedding's, used by every padded row) is caught, and the next step's loss moves."""
    from pivot.roles.titan.context import HostStash

    real = HostStash.reload

    def corrupt(self):
        self.entries[0][1][3] ^= 0x20  # byte 3 of a little-endian fp32: exponent bits
        return real(self)

    monkeypatch.setattr(HostStash, "reload", corrupt)
    out = tmp_path / "check.json"
    assert gpu_check.main(["--cpu_dry_run", "--out", str(out), "--only", "step",
                           "--repeats", "1"]) == 1
    res = json.loads(out.read_text())
    c = res["checks"]
    assert res["passed"] is False and c["bit_exact[param]"] is False
    assert c["bit_exact[grad]"] and c["bit_exact[opt]"] and not c["next_step_loss_equal"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_without_a_gpu_it_says_so_in_one_line_and_exits_2(tmp_path):
    out = tmp_path / "check.json"
    p = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out)], capture_output=True,
                       text=True, cwd=tmp_path, timeout=300)
    assert p.returncode == 2
    assert len(p.stderr.strip().splitlines()) == 1 and "no CUDA device" in p.stderr
    assert "--cpu_dry_run" in p.stderr and not out.exists()


@pytest.mark.parametrize("blocked,implementation", [
    (("vllm", "monarch", "nixl"), "torchtitan"),
    (("vllm", "monarch", "nixl", "torchtitan"), "transformers"),
])
def test_nothing_it_imports_pulls_in_vllm_monarch_or_nixl(tmp_path, blocked, implementation):
    """Runs the whole dry run in a fresh process whose importer refuses those packages (and
    torchtitan too, for the fallback model): no import of them is even tried."""
    out = tmp_path / "check.json"
    code = BLOCKING_RUN.format(blocked=set(blocked), out=str(out), script=str(SCRIPT))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=tmp_path, timeout=600)
    line = [x for x in p.stdout.splitlines() if x.startswith("IMPORTS ")]
    assert line, p.stdout[-2000:] + p.stderr[-2000:]
    imports = json.loads(line[0][len("IMPORTS "):])
    assert imports == {"tried": [], "loaded": [], "code": 0} or (
        "torchtitan" in blocked and imports["loaded"] == [] and imports["code"] == 0
        and {n.split(".")[0] for n in imports["tried"]} == {"torchtitan"}), imports
    res = json.loads(out.read_text())
    assert res["passed"] is True
    assert res["grpo_shift"]["implementation"].startswith(implementation)
    # the product's trainer is torchtitan's: without it that part says why it was skipped
    assert ("skipped" in res["trainer"]) == ("torchtitan" in blocked), res["trainer"]
    assert ("trainer_round_trip_logprobs_exact" in res["checks"]) == (
        "torchtitan" not in blocked)


def test_a_torchtitan_that_fails_on_this_torch_falls_back_or_is_reported(tmp_path, monkeypatch):
    """torchtitan may import on the GPU machine's torch and still fail: "auto" reruns the
    step on transformers' model and says why; "torchtitan" records the failure, fails the
    run, and still writes the bandwidth figures."""
    import pivot.roles.titan.qwen2 as q2

    def broken(*args, **kwargs):
        raise RuntimeError("torchtitan does not run on this torch")

    monkeypatch.setattr(q2, "build_qwen2", broken)
    out = tmp_path / "auto.json"
    assert gpu_check.main(["--cpu_dry_run", "--out", str(out), "--only", "step",
                           "--repeats", "1"]) == 0
    g = json.loads(out.read_text())["grpo_shift"]
    assert g["implementation"].startswith("transformers")
    assert "does not run on this torch" in g["fallback_reason"]

    out = tmp_path / "titan.json"
    assert gpu_check.main(["--cpu_dry_run", "--out", str(out), "--model", "torchtitan",
                           "--repeats", "1"]) == 1
    res = json.loads(out.read_text())
    assert res["checks"]["grpo_shift_ran"] is False and res["checks"]["bandwidth_ran"]
    assert "does not run on this torch" in res["grpo_shift"]["error"]
    assert res["bandwidth"]["reads"][0]["bit_exact"] is True
