"""The fault / bad-input matrix: writes results/reliability/faults.json.

    python experiments/faults.py [--bad-input-only]

Runs (1) one short simulated soak per fault kind (replica kills only, mid-shift failures
only, both), 256 devices, with every invariant checked after every event, and (2) every
bad-input case of ``pivot.runners.bad_input``. Reports faults injected and survived,
sequences lost, how each bad input ended, and the time to recover from each kind of fault.
``--bad-input-only`` reruns (2) alone (a few seconds) and keeps the soak results (1) of the
existing faults.json.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from dataclasses import asdict

from pivot.paths import REPO_ROOT as ROOT

from pivot.runners.bad_input import run_all
from pivot.runners.soak import SoakConfig, run_soak

FAULT_KINDS = {
    "replica_killed": dict(kill_rate=0.3, shift_fail_rate=0.0),
    "shift_up_failed_midway": dict(kill_rate=0.0, shift_fail_rate=0.1),
    "both": dict(kill_rate=0.3, shift_fail_rate=0.1),
}


OUT = ROOT / "results/reliability/faults.json"


def run_faults() -> dict[str, dict]:
    """One short simulated soak per fault kind; the fields faults.json reports."""
    faults = {}
    for kind, kw in FAULT_KINDS.items():
        rep = run_soak(SoakConfig(devices=256, target_shifts=500, seed=7, **kw)).to_dict()
        faults[kind] = {k: rep[k] for k in (
            "faults_injected", "faults_survived", "failed_shifts", "shift_plans",
            "invariant_checks", "sequences_released", "sequences_finished",
            "sequences_lost", "recover_virtual_s", "kill_handle_wall_s", "violations")}
        print(f"{kind:>24}: injected {rep['faults_injected']}, survived "
              f"{rep['faults_survived']}, lost {rep['sequences_lost']}, recover "
              f"{rep['recover_virtual_s']}")
    return faults


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bad-input-only", action="store_true",
                    help="rerun only the bad-input table; keep the soaks of faults.json")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("pivot").setLevel(logging.CRITICAL)  # injected faults; counted below
    os.chdir(ROOT)
    if args.bad_input_only:
        if not OUT.is_file():
            print(f"--bad-input-only: {OUT} does not exist; run experiments/faults.py "
                  f"once without it", file=sys.stderr)
            return 2
        faults = json.loads(OUT.read_text())["faults"]
    else:
        faults = run_faults()
    bad = [dict(asdict(o), as_expected=o.as_expected) for o in run_all()]
    for o in bad:
        print(f"{'ok' if o['as_expected'] else 'FINDING':>8} {o['name']:<52} {o['ended']}")
    out = {"faults": faults, "bad_inputs": bad,
           "summary": {"faults_injected": sum(f["faults_injected"] for f in faults.values()),
                       "faults_survived": sum(f["faults_survived"] for f in faults.values()),
                       "sequences_lost": sum(f["sequences_lost"] for f in faults.values()),
                       "bad_inputs_tried": len(bad),
                       "bad_inputs_as_expected": sum(o["as_expected"] for o in bad),
                       "ended": {e: sum(o["ended"] == e for o in bad)
                                 for e in sorted({o["ended"] for o in bad})}}}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(out, indent=1))
    print(json.dumps(out["summary"], indent=1))
    return 0 if out["summary"]["sequences_lost"] == 0 else 1

if __name__ == "__main__":
    sys.exit(main())
