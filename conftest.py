"""The project's own tests run without an example database unless a test asks for one:
a failure stored by an earlier test (or an earlier session, in ~/.cache) would be replayed
first and change the counterexamples and counts that tests compare. The database's own
tests (tests/test_database.py) set one explicitly."""

import os

os.environ["KVORACLE_DATABASE"] = "none"

# No time limit per example in the project's own property tests: a limit turns a loaded machine
# into a failure (Hypothesis' default is 200 ms; its "ci" profile, loaded when CI is set, has
# none). The profile keeps everything else of the one loaded (the "ci" one's derandomizing too).
from hypothesis import settings

settings.register_profile("kvoracle-tests", settings(deadline=None))
settings.load_profile("kvoracle-tests")
