"""Amounts print compactly at any magnitude a cost file can produce, and as the page's calculator prints them."""

import pytest

from specledger.ledger.answer import money


@pytest.mark.parametrize("value, text", [
    (None, "–"), (0, "$0"), (0.0123456, "$0.0123"), (1.5, "$1.50"), (1234.5, "$1,234"), (-2.5, "-$2.50"),
    (999_999_999, "$999,999,999"), (1e9, "$1.00e9"), (1e308, "$1.00e308"), (1e-320, "$1.00e-320"),
    (9.99e-5, "$9.99e-5"), (-3.2e12, "-$3.20e12"),
])
def test_money_is_compact(value, text):
    assert money(value) == text


def test_no_amount_is_long():
    assert all(len(money(10.0 ** e)) <= 16 for e in range(-320, 309))
