"""The reference uses the spec's contract switch: see :mod:`kvoracle.spec.contracts`.

``KVORACLE_CONTRACTS=0`` in the environment before import turns every
icontract pre/postcondition and invariant of the spec and the reference off.
"""

from __future__ import annotations

from kvoracle.spec.contracts import ENABLED

__all__ = ["ENABLED"]
