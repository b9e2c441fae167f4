"""The RL loop (sec. 8.1, app. E): GRPO groups, R = R_verifiable + R_GenRM, asynchronous
with data staleness 2, checkpoint and resume. Pure: engines plug in through ``ports``."""
