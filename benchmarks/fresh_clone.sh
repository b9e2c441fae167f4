#!/usr/bin/env bash
# Times README's first command on a fresh clone of this repository: the default run, model
# build included, is meant to fit in 10 minutes on the 2-core machine.
#
#   bash benchmarks/fresh_clone.sh [workdir]      # default workdir: a new mktemp -d
#
# Clones HEAD into <workdir>/clone (no cache/, no runs/: the models are built, vLLM's and
# inductor's compile caches start empty), reuses this checkout's .venv (the install is not
# part of the budget) and runs `launchers/run.py` there with PYTHONPATH pointing at the
# clone, so its own `pivot/` and `cache/` are used, not the editable install's. Prints the
# end-to-end wall time, the build's seconds and config digest from the clone's manifest,
# and the sha256 of both built models (equal to this checkout's when its build is the same
# config). Run it with nothing else on the machine: the build's SFT steps slow down
# several-fold when another job holds a core (docs/results.md, "The workload and the main
# job").
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="${1:-$(mktemp -d)}"
clone="$work/clone"
[ -x "$repo/.venv/bin/python" ] || { echo "time_fresh_clone.sh: $repo/.venv is missing; run bash launchers/install.sh first" >&2; exit 2; }
[ -e "$clone" ] && { echo "time_fresh_clone.sh: $clone exists; pass an empty workdir" >&2; exit 2; }
git clone -q "$repo" "$clone"
ln -s "$repo/.venv" "$clone/.venv"
cd "$clone"
start=$(date +%s)
rc=0
PYTHONPATH="$clone" .venv/bin/python launchers/run.py --no_progress > "$work/run.out" 2>&1 || rc=$?
wall=$(( $(date +%s) - start ))
tail -n 16 "$work/run.out"
if [ ! -f "$clone/cache/models/manifest.json" ]; then
  echo "time_fresh_clone.sh: no build manifest; run.py exit $rc after ${wall} s (see $work/run.out)" >&2
  exit 1
fi
.venv/bin/python - "$clone/cache/models/manifest.json" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1]))
r = m["results"]
print(f"build: {m['build_seconds']} s (policy SFT {r['policy']['sft_seconds']} s, GenRM SFT "
      f"{r['genrm']['sft_seconds']} s), digest {m['digest']}, accuracy@1 "
      f"{r['policy']['accuracy_at_1']}, GenRM Pearson on policy outputs "
      f"{r['genrm']['policy_outputs']['pearson']:.3f}")
EOF
sha256sum "$clone"/cache/models/{policy,genrm}/model.safetensors
echo "fresh clone: run.py exit $rc, ${wall} s end to end (workdir $work)"
