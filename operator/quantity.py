"""Kubernetes resource quantities in the API server's canonical spelling.

The API server stores ``cpu: "0.5"`` as ``500m`` and ``memory: "1.5Gi"`` as ``1536Mi``. Desired
objects that keep the user's spelling never equal what the server hands back, so reconcile-by-diff
would patch them on every pass. :func:`canonical` spells a quantity the way
``resource.Quantity.String()`` does (apimachinery): binary suffixes (Ki..Ei) stay binary when the
value is a whole number of at least 1Ki; everything else is decimal with the largest SI suffix
(n, u, m, "", k, M, G, T, P, E) that keeps the mantissa whole, rounded up to nano units.
"""

from __future__ import annotations

import re
from decimal import ROUND_CEILING, Decimal

_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_SUFFIX_BY_EXP = {v: k for k, v in _DECIMAL.items()}
PATTERN = r"^[0-9]+(\.[0-9]+)?(n|u|m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$"
_RE = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(n|u|m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")


def parse(text: str) -> tuple[Decimal, bool]:
    """(value in base units, written with a binary suffix)."""
    m = _RE.match(text)
    if not m:
        raise ValueError(f"not a quantity: {text!r}")
    number, suffix = Decimal(m.group(1)), m.group(2) or ""
    if suffix in _BINARY:
        return number * (Decimal(1024) ** _BINARY[suffix]), True
    return number.scaleb(_DECIMAL[suffix]), False


def canonical(text: str) -> str:
    """The API server's spelling of a non-negative quantity (``0.5`` -> ``500m``)."""
    value, binary = parse(text)
    if binary and value == value.to_integral_value() and value >= 1024:
        n, k = int(value), 0
        while k < 6 and n % 1024 == 0:
            n //= 1024
            k += 1
        suffix = {v: s for s, v in _BINARY.items()}.get(k, "")
        return f"{n}{suffix}"
    nanos = int((value * Decimal(10) ** 9).to_integral_value(rounding=ROUND_CEILING))
    if nanos == 0:
        return "0"
    exp = -9
    while exp < 18 and nanos % 1000 == 0:
        nanos //= 1000
        exp += 3
    return f"{nanos}{_SUFFIX_BY_EXP[exp]}"
