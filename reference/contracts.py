"""The switch that turns the reference's contracts on and off.

Contracts are on by default: every icontract pre/postcondition and invariant
of the reference runs, and a violation raises ``icontract.ViolationError``
whose message starts with the rule ID it checks.

Set the environment variable ``KVORACLE_CONTRACTS=0`` *before* importing
``kvoracle.reference`` to build the classes without contracts (icontract then
does not wrap the methods at all), for speed. The conformance suite still
checks every rule on observable state either way.
"""

from __future__ import annotations

import os

#: Whether the reference's icontract conditions are installed (read at import time).
ENABLED: bool = os.environ.get("KVORACLE_CONTRACTS", "1").strip().lower() not in (
    "0", "false", "off", "no",
)
