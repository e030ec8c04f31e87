"""CrossHair plugin: give icontract a concrete re-entrancy set before analysis starts.

Load it with ``crosshair check --extra_plugin=scripts/crosshair_icontract_plugin.py``
(CrossHair ``exec``s the file before it analyses anything).

Why: icontract keeps the functions whose contracts are being checked in a set held by a
``ContextVar`` (``icontract._checkers._IN_PROGRESS``) and creates that set lazily, on the
first call of a contracted function. If the first call happens inside CrossHair's
symbolic execution -- a spec function under analysis that calls another contracted
function, as ``full_attention_hit_length`` calls ``longest_cached_run`` and
``num_blocks_to_allocate`` calls ``cdiv`` -- CrossHair's patched ``set()`` makes it a
symbolic ``ShellMutableSet``, and the ``ContextVar`` carries it from one iteration to the
next. Every iteration then nests it deeper, until CrossHair reports spurious
``NotDeterministic`` or ``RecursionError`` failures on those functions (seen with
per-condition timeouts of 25 s). Creating the set here, concretely, avoids that; it
changes nothing else.
"""

import icontract._checkers

if icontract._checkers._IN_PROGRESS.get() is None:
    icontract._checkers._IN_PROGRESS.set(set())
