"""The SFT sweep (experiments/sft_sweep.py) trains and reports one run per setting."""

import json
import subprocess
import sys
from pathlib import Path

from pivot.data.chains import MAX_STEPS
from pivot.models.evaluate import STEP_ERRORS

ROOT = Path(__file__).resolve().parents[2]


def test_the_sweep_reports_every_setting(tmp_path):
    out = tmp_path / "sweep.json"
    r = subprocess.run([sys.executable, "experiments/sft_sweep.py", "--lr", "5e-3", "2e-3",
                        "--steps", "2", "--per_level", "2", "--out", str(out),
                        "--save", str(tmp_path / "models")],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    runs = json.loads(out.read_text())["runs"]
    assert [(run["lr"], run["steps"]) for run in runs] == [(5e-3, 2), (2e-3, 2)]
    for run in runs:
        assert sorted(int(k) for k in run["by_level"]) == list(range(1, MAX_STEPS + 1))
        assert set(run["first_errors"]) <= set(STEP_ERRORS)
        # two SFT steps teach nothing: every one of the 20 responses is wrong somewhere
        assert sum(run["first_errors"].values()) == 2 * MAX_STEPS
    assert "val acc@1" in r.stdout
    # each run's policy is kept where the report says, loadable with its tokenizer
    from transformers import AutoModelForCausalLM, AutoTokenizer
    saved = [Path(run["saved"]) for run in runs]
    assert len(set(saved)) == 2 and all(p.parent == tmp_path / "models" for p in saved)
    for p in saved:
        AutoTokenizer.from_pretrained(p)
        AutoModelForCausalLM.from_pretrained(p)
