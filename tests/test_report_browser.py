"""The report in a real headless browser (Debian chromium driven by Playwright).

Loads with no console errors, the charts render, and editing the wage changes the cost per
accepted task to the value the Python model computes for that wage.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from specledger.ledger.inputs import example_text, parse_inputs
from specledger.ledger.price import price_measurements, price_run
from specledger.report.html import write_report
from test_ledger_fixtures import DEFAULT_SPECS, Spec, make_run

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary found (scripts/test-setup.sh installs Debian's)"),
]


@pytest.fixture(scope="module")
def page_and_ledger(tmp_path_factory):
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    root = tmp_path_factory.mktemp("browser")
    specs = DEFAULT_SPECS + [Spec("broken", "eagle", passes=0, tau=2.0), Spec("ar-c2", "ar", concurrency=(1, 2))]
    run_dir = make_run(root, specs, n=10)
    ledger = price_run(run_dir, None, samples=200)
    path = write_report(run_dir, ledger, root / "report.html")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page()
        errors: list[str] = []
        page.on("console", lambda m: errors.append(m.text) if m.type in ("error", "warning") else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("request", lambda r: errors.append(f"network request: {r.url}") if not r.url.startswith(("file:", "data:")) else None)
        page.goto(path.as_uri())
        page.wait_for_selector("#calc-table tbody tr")
        yield page, ledger, errors
        browser.close()


def total_in_page(page, config: str) -> float:
    value = page.locator(f'#calc-table tr[data-config="{config}"] td.calc-total').get_attribute("data-value")
    return float(value)


def test_loads_without_console_errors_and_draws_the_charts(page_and_ledger):
    page, ledger, errors = page_and_ledger
    assert errors == []
    assert page.locator(".chart svg").count() >= 6  # the static charts
    # the calculator's own chart: one stacked bar per priced configuration
    priced = [r for r in ledger.configs if r.total is not None]
    assert page.locator("#calc-chart svg rect.part-labour").count() == len(priced)
    assert page.locator("#calc-table tbody tr").count() == len(ledger.configs)
    broken = page.locator('#calc-table tr[data-config="broken"] td.calc-verdict').inner_text()
    assert broken.startswith("infinite cost")
    for r in priced:  # before any edit the page shows the Python point values
        assert total_in_page(page, r.name) == pytest.approx(r.total, rel=1e-12)


def test_changing_the_wage_gives_the_python_cost(page_and_ledger):
    page, ledger, errors = page_and_ledger
    wage = page.locator('[id="in-acceptance.wage_per_hour"]')
    before = total_in_page(page, "eagle-fp32")
    wage.fill("95")
    doc = yaml.safe_load(example_text())
    doc["acceptance"]["wage_per_hour"] = 95
    # the page starts from the headline scenario (the file's first); keep the file's order when writing it
    # back (yaml's default sorts the keys, which made "fully-automated" the headline: session 4's "defect")
    inputs = parse_inputs(yaml.safe_dump(doc, sort_keys=False))
    assert ledger.scenario == next(iter(inputs.scenarios)) == "human-reviewed"
    expected = price_measurements(ledger.measurements, inputs, samples=0)
    assert expected.scenario == "human-reviewed"
    for r in expected.configs:
        if r.total is not None:
            assert total_in_page(page, r.name) == pytest.approx(r.total, rel=1e-12), r.name
    assert total_in_page(page, "eagle-fp32") > before
    # an invalid entry is flagged and leaves the numbers alone
    wage.fill("-1")
    assert "invalid" in wage.get_attribute("class")
    assert total_in_page(page, "eagle-fp32") == pytest.approx(expected.config("eagle-fp32").total, rel=1e-12)
    page.click("#calc-reset")
    assert total_in_page(page, "eagle-fp32") == pytest.approx(before, rel=1e-12)
    assert errors == []
