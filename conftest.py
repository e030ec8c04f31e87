"""The project's own tests run without an example database unless a test asks for one:
a failure stored by an earlier test (or an earlier session, in ~/.cache) would be replayed
first and change the counterexamples and counts that tests compare. The database's own
tests (tests/test_database.py) set one explicitly."""

import os

os.environ["KVORACLE_DATABASE"] = "none"
