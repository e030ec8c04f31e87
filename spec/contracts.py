"""The one switch for every icontract condition in kvoracle (spec and reference).

Contracts are on by default. Set the environment variable
``KVORACLE_CONTRACTS=0`` before importing kvoracle to build every function
and class without them (icontract then wraps nothing), for speed. The
conformance suite judges engines on observable state either way; CrossHair
needs them on.
"""

from __future__ import annotations

import os

#: Whether kvoracle's icontract conditions are installed (read once, at import time).
ENABLED: bool = os.environ.get("KVORACLE_CONTRACTS", "1").strip().lower() not in (
    "0", "false", "off", "no",
)
