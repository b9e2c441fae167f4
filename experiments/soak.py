"""Simulated soak: forced shifts, replica kills and failing shifts on a 1024-device simulated
cluster, every invariant checked after every event (incrementally: what the event touched,
plus O(1) counters) and in full every --full_check_every events and at the end; writes
results/reliability/soak.json.

    python experiments/soak.py                       # 1024 devices, 10,000 shift plans
    python experiments/soak.py --devices 64 --shifts 200
    python experiments/soak.py --out results/reliability/soak_1024.json
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from pivot.paths import REPO_ROOT as ROOT

from pivot.errors import ConfigError
from pivot.reliability.invariants import InvariantError
from pivot.runners.soak import SoakConfig, run_soak


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--devices", type=int, default=SoakConfig.devices)
    p.add_argument("--shifts", type=int, default=SoakConfig.target_shifts,
                   help="shift plans before draining")
    p.add_argument("--kill_rate", type=float, default=SoakConfig.kill_rate,
                   help="replica kills per tick")
    p.add_argument("--shift_fail_rate", type=float, default=SoakConfig.shift_fail_rate,
                   help="probability that an inference shift up fails midway")
    p.add_argument("--full_check_every", type=int, default=SoakConfig.full_check_every,
                   help="events between full checks (the incremental check runs at every "
                        "event)")
    p.add_argument("--max_wall_s", type=float, default=SoakConfig.max_wall_s,
                   help="wall-clock bound; a soak past it stops and fails")
    p.add_argument("--seed", type=int, default=SoakConfig.seed)
    p.add_argument("--out", default="results/reliability/soak.json")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    # Injected faults log errors; they are counted below.
    logging.getLogger("pivot").setLevel(logging.CRITICAL)
    os.chdir(ROOT)
    try:
        cfg = SoakConfig(devices=a.devices, target_shifts=a.shifts, kill_rate=a.kill_rate,
                         shift_fail_rate=a.shift_fail_rate,
                         full_check_every=a.full_check_every, max_wall_s=a.max_wall_s,
                         seed=a.seed)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        rep = run_soak(cfg)
    except InvariantError as e:
        print(f"INVARIANT VIOLATED: {e}", file=sys.stderr)
        return 1
    out = {"config": cfg.__dict__, **rep.to_dict()}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1))
    for k in ("devices", "shift_plans", "failed_shifts", "replica_shifts", "events",
              "invariant_checks", "incremental_checks", "full_checks", "prefix_checks",
              "faults_injected", "faults_survived", "devices_recovered",
              "sequences_requeued_by_faults", "sequences_released", "sequences_finished",
              "sequences_lost", "steps_trained", "virtual_s", "wall_s", "wall_ms_per_event",
              "checked_items", "check_wall_s", "recover_virtual_s", "violations"):
        print(f"{k:>28}: {out[k]}")
    return 0 if rep.sequences_lost == 0 and not rep.violations else 1


if __name__ == "__main__":
    sys.exit(main())
