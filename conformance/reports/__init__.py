"""Reports of a ``kvoracle check`` beyond the verdict table: JUnit XML for CI systems, the
versioned JSON report's schema, the HTML report with a picture of each failure, and the
live progress display. Each reads a finished :class:`~..harness.runner.CheckResult` (the
progress display, a running one); none changes a verdict.
"""
