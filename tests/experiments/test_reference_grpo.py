"""The plain GRPO loop (experiments/reference_grpo.py) runs end to end on a tiny model."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_reference_loop_trains_and_validates(tiny_model, tmp_path):
    out = tmp_path / "ref.json"
    r = subprocess.run([sys.executable, "experiments/reference_grpo.py", "--model", tiny_model,
                        "--prompts", "2", "--n", "2", "--steps", "2", "--eval_every", "1",
                        "--max_tokens", "4", "--out", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert [row["step"] for row in rows] == [0, 1, 2]
    assert all(0.0 <= row["val_acc"] <= 1.0 for row in rows)
    assert all(0.0 <= row["sample_acc"] <= 1.0 for row in rows[1:])
