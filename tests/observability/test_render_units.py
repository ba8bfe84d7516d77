"""The rendered dashboards' axis labels: seconds read as ms below 1 s, with tenths below 10 ms (the
engine's GIL wait is ~0.3 ms: whole milliseconds labelled every tick of its panel "0 ms" or "1 ms")."""

from __future__ import annotations

import pytest

from ttsfleet.observability.render import _fmt


@pytest.mark.parametrize(("value", "label"), [
    (0.0, "0 ms"), (0.00027, "0.3 ms"), (0.0046, "4.6 ms"), (0.0173, "17 ms"), (0.45, "450 ms"),
    (1.0, "1.0 s"), (12.5, "12.5 s"),
])
def test_seconds_are_labelled_in_the_unit_that_tells_ticks_apart(value: float, label: str) -> None:
    assert _fmt(value, "s") == label


def test_other_units_are_unchanged() -> None:
    assert _fmt(0.123, "percentunit") == "12.3%" and _fmt(2.0, "reqps") == "2.00 req/s"
    assert _fmt(12345.0, "short") == "1.23e+04"
