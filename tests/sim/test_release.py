"""The rule-based strategy's release-only plans (shift down to the idle pool) are carried
out by the driver, and work is still conserved."""

from pivot.planner import RuleBasedPlanner
from pivot.spec.deployment import Deployment
from pivot.sim.driver import SimDriver


def test_rule_based_releases_and_conserves_work(make_group):
    dep = Deployment("rule_based", RuleBasedPlanner, rollout_devices=4, reward_devices=8)
    d = SimDriver(make_group(), dep, steps=3, seed=1)
    res = d.run()
    releases = [s for s in res.shift_log if s["up_role"] == "idle"]
    assert releases, "expected at least one release to the idle pool"
    assert res.generated_tokens == res.expected_tokens
    for s in d.schedulers.values():
        s.check()
