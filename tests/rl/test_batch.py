"""The GRPO batch built from rewarded groups."""

import torch

from pivot.rl.batch import build_train_batch
from pivot.rl.trajectory import PromptGroup, Trajectory


def traj(i, prompt, resp, reward, version=0):
    t = Trajectory(i, 0, i // 2, i % 2, prompt, "1", "q", version)
    t.response_tokens, t.response_logprobs = resp, [-0.1 * (k + 1) for k in range(len(resp))]
    t.reward = reward
    return t


def test_rows_are_right_padded_with_logprobs_at_the_tokens_they_score():
    g = [PromptGroup(0, 0, [traj(0, [1, 2], [3, 4, 5], 1.0), traj(1, [1, 2], [6], 0.0)]),
         PromptGroup(0, 1, [traj(2, [1], [7, 8], 0.5), traj(3, [1], [9], 0.5, version=1)])]
    b = build_train_batch(g)
    b.check()
    assert b.input_ids.tolist()[0] == [1, 2, 3, 4, 5]
    assert b.input_ids.tolist()[1] == [1, 2, 6, 0, 0]
    assert b.response_mask.tolist()[1] == [0, 0, 1, 0, 0]
    assert torch.allclose(b.old_logprobs[0, 2:5], torch.tensor([-0.1, -0.2, -0.3]))
    adv = b.advantages.tolist()
    assert adv[0] > 0 > adv[1] and abs(adv[2]) < 1e-6 and abs(adv[3]) < 1e-6
    assert b.policy_version.tolist() == [0, 0, 0, 1]
