"""One ``LocalStack`` (GPS, 4 device slots, one vLLM engine and one trainer context each)
for the whole test session: engines start once (about 50-80 s on 2 cores); each run resets
the slots to idle and GPS to the initial weights, never restarting an engine."""

import pytest

from pivot.local.group import LocalGroup

GROUP = dict(n=2, max_response_tokens=16, max_judge_tokens=16)


@pytest.fixture(scope="session")
def stack():
    from pivot.local.stack import LocalStack

    s = LocalStack(LocalGroup(**GROUP)).start()
    yield s
    s.close()
