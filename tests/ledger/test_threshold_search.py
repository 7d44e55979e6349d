"""The decision-threshold search (ledger/thresholds.py) as a user reads it: how far it looks, which of two changes
it reports, and which side of its interval stays open when some samples never cross within the range searched.

Two configurations at $0.01 per device-second, every attempt passing: ar pays ~$0.06 of compute per task, fast
~$0.03; a person reviews every task at $1 a minute, so the decoding choice stops mattering (a 1% difference) near
2.97 minutes of review (tests/ledger/test_answer.py's CROSSING)."""

from __future__ import annotations

import pytest

from specledger.ledger.inputs import parse_inputs
from specledger.ledger.price import price_run
from tests.ledger.test_answer import CROSSING, INPUTS, inputs
from tests.ledger.test_ledger_fixtures import Spec, make_run


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("thresholds"), [Spec("ar-fp32", "ar", service_s=6.0),
                                                             Spec("fast", "lookup", service_s=3.0, tau=2.0)])


def _review(run_dir, minutes: float):
    a = price_run(run_dir, inputs(minutes), samples=1000).answer.scenarios[0]
    return a, next(t for t in a.thresholds if t.input == "acceptance.review_minutes")


def test_the_search_looks_a_hundred_times_past_todays_value(run_dir):
    """At 12 s of review fast is clearly cheapest; the tie begins ~13x higher (about 2.5-3 min): a search that
    stopped at 10x would say "no change" where the answer does change."""
    a, review = _review(run_dir, 0.2)
    assert a.recommended == "fast" and review.before == "fast" and review.after == "tie"
    assert review.value is not None and review.side == "above", review.change
    assert 0.8 * CROSSING < review.value < CROSSING and review.searched_high == pytest.approx(20.0)


def test_samples_that_never_cross_leave_the_far_side_of_the_interval_open(run_dir):
    """From 1.8 s of review the search reaches 3 min (100x): the verdict changes near 2.5 min, but many samples
    cross past 3 min or not at all within the range. Their crossing is beyond the range, on its far side: the
    interval reads "2.x min or more", never "up to 3 min"."""
    _, review = _review(run_dir, 0.03)
    assert review.value is not None and review.side == "above" and review.searched_high == pytest.approx(3.0)
    assert review.high is None, (review.low, review.high)
    assert review.low is not None and review.current < review.low <= review.value
    assert "or more" in review.change and "up to" not in review.change


def test_of_two_changes_the_nearer_one_is_reported(tmp_path):
    """A draft head retrained monthly ($330 a month, only eagle pays it) against half the compute per task: at
    10,000 tasks a month the two tie; fewer tasks and the retraining makes ar cheapest (below ~8,500), more and
    eagle's saving wins (above ~15,000). The nearer change, on a log scale, is ar's below."""
    run = make_run(tmp_path, [Spec("ar-fp32", "ar", service_s=6.0), Spec("eagle", "eagle", service_s=3.0, tau=2.5)])
    text = (INPUTS.replace("REVIEW", "0.5").replace("tasks_per_month: 10000", "tasks_per_month: 10000")
            + "maintenance: {engineering_hours_per_month: 0, retraining_hours: 5.5, retraining_device_hours: 0, "
              "changes_per_year: 12}\n")
    a = price_run(run, parse_inputs(text), samples=1000).answer.scenarios[0]
    volume = next(t for t in a.thresholds if t.input == "volume.tasks_per_month")
    assert a.tie and volume.before == "tie", (a.recommended, volume.before)
    assert volume.side == "below" and volume.after == "ar-fp32", volume.change
    assert 5000 < volume.value < 10000
