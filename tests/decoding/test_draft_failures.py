"""A failure in the batch's draft planning (the policy's sizing, the drafter's proposals, the policy's learning)
degrades that pass to no drafting: every request goes on and ends as it would alone (verification without a draft
is lossless), the failure is counted and logged in one line (no traceback), and drafting resumes on the next pass."""

from __future__ import annotations

import logging

import pytest
from tests.support.varied_model import FLAT, alone, run_joining, varied_model, varied_prompts

from specledger.decoding.drafters.model import ModelDrafter
from specledger.decoding.factory import make_strategy
from specledger.decoding.loop.scheduler import Scheduler
from specledger.decoding.sampling import SamplingParams

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py

MAX_NEW = [30, 12, 25, 40, 18]


def hier_scheduler(lm) -> Scheduler:
    st = make_strategy("hier", lm, intermediate=varied_model(noise=0.1), drafter="lookup", lookup_tokens=3,
                       min_chain=2, max_chain=4)
    return Scheduler(lm, max_batch=4, prefill_chunk=8, drafter=st.batch_drafter(4), cost=FLAT)


def fail_on(obj, name: str, calls: set[int] | None) -> dict[str, int]:
    """obj.name raises on the given calls (1-based; None: on every call); returns the call counter."""
    real = getattr(obj, name)
    n = {"calls": 0}

    def broken(*a, **k):
        n["calls"] += 1
        if calls is None or n["calls"] in calls:
            raise RuntimeError(f"injected failure in {name}")
        return real(*a, **k)

    setattr(obj, name, broken)
    return n


@pytest.mark.parametrize("where", ["drafter.propose", "policy.plan", "policy.observe", "policy.accepted",
                                   "always"])
def test_a_planning_failure_drops_that_pass_drafts_and_nothing_else(where, caplog):
    lm = varied_model()
    sched = hier_scheduler(lm)
    spec = sched.spec
    assert spec is not None and isinstance(spec.drafter, ModelDrafter)
    if where == "always":  # a drafter broken for good: the requests are decoded without drafts
        counter = fail_on(spec.drafter, "propose", None)
    else:
        owner, name = where.split(".")
        counter = fail_on(spec.drafter if owner == "drafter" else spec.policy, name, {2, 5})
    prompts = varied_prompts(n=5, seed=2)
    with caplog.at_level(logging.WARNING, logger="specledger"):
        results = run_joining(sched, prompts, MAX_NEW)
    for i, p in enumerate(prompts):
        want = alone(lm, p, SamplingParams(max_tokens=MAX_NEW[i], temperature=0.0))
        assert results[i].finish_reason == want.finish_reason, (i, results[i].error)
        assert results[i].token_ids == want.token_ids, i
    failed = counter["calls"] if where == "always" else 2
    assert counter["calls"] >= failed and spec.failures == failed
    lines = [r for r in caplog.records if r.name.startswith("specledger")]
    assert all(r.exc_info is None and "\n" not in r.getMessage() for r in lines)
    assert all("injected failure" in r.getMessage() for r in lines)
    # logged once per failure, or (a failure every pass) on the 1st, 2nd, 4th, 8th ...
    assert len(lines) == (failed if failed <= 2 else failed.bit_length())
    top = [r.levels[-1] for r in results.values()]
    if where == "always":
        assert sum(lv.proposed for lv in top) == 0
    else:  # drafting went on around the failed passes
        assert sum(lv.accepted for lv in top) > 0
