"""Example databases: every failure found anywhere is replayed first everywhere.

A run keeps the failing examples it shrank in a Hypothesis example database, under a
key of its suite and engine, and the next run against that engine -- in this process,
in another, on another machine sharing the database -- replays them before it draws
anything new. The database is Hypothesis' own: a directory
(:class:`~hypothesis.database.DirectoryBasedExampleDatabase`, the ``kvoracle check``
default is ``examples/`` under Hypothesis' directory, never the current directory) or
Redis (:class:`~hypothesis.extra.redis.RedisExampleDatabase`, from a ``redis://`` URL,
needing the ``kvoracle[fuzz]`` extra), which HypoFuzz's workers share as well.

What is stored is Hypothesis' choice sequence, not the steps: a replay draws the same
steps only while the suite's machine draws as it did when the example was saved.

The runner (:mod:`.runner`) gives the stored examples a round of their own, before the
search rounds: Hypothesis replays them (and drops those that no longer fail -- nothing is
suppressed yet in that round, so a pass there means the engine no longer fails that
way), the failures are recorded and their rules suppressed as after any round, and then
the search rounds draw from the seed exactly as a run without a database would. Only
that round reads the database; every round saves the failures it shrinks. So a database
adds convictions, never removes one a seed finds: a replayed failure is judged by the
same checks, shrunk with the same budget, and written as a replay file like any other.
A run without a database (the library default, ``RunOptions.database=None``) draws from
the seed alone.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase

#: URL schemes read as a Redis server.
REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


class DatabaseError(ValueError):
    """A database that cannot be opened (the message names the option and the cause)."""


#: The environment variable naming the database when no option does ("none": no database).
ENVIRONMENT = "KVORACLE_DATABASE"


def chosen_database(option: str | None, hypothesis_dir: Path) -> str | None:
    """The database of a ``kvoracle check`` (or a pytest run with the plugin): the option,
    else ``$KVORACLE_DATABASE``, else ``examples/`` in Hypothesis' directory; ``none`` for no
    database."""
    spec = option or os.environ.get(ENVIRONMENT, "")
    if spec.lower() == "none":
        return None
    return spec or str(hypothesis_dir / "examples")


def shown(spec: str) -> str:
    """``spec`` as reports and progress lines show it: a Redis URL without its password."""
    if is_redis(spec) and "@" in spec:
        scheme, rest = spec.split("://", 1)
        return f"{scheme}://***@{rest.rsplit('@', 1)[1]}"
    return spec


def is_redis(spec: str) -> bool:
    return spec.startswith(REDIS_SCHEMES)


def open_database(spec: str, check: bool = False) -> ExampleDatabase:
    """The example database ``spec`` names: a Redis URL or a directory (made if missing).

    With ``check`` a Redis server is asked for a ``PING`` now, so that a wrong URL is an
    error before a run, not a warning in the middle of one."""
    if is_redis(spec):
        try:
            import redis
            from hypothesis.extra.redis import RedisExampleDatabase
        except ImportError:
            raise DatabaseError(f"database {spec}: a Redis database needs the redis package "
                                "(pip install 'kvoracle[fuzz]')") from None
        try:
            client = redis.Redis.from_url(spec)
            if check:
                client.ping()
        except (redis.RedisError, ValueError) as error:
            raise DatabaseError(f"database {spec}: {error}") from None
        return RedisExampleDatabase(client, key_prefix=b"kvoracle:")
    path = Path(spec).expanduser()
    if path.exists() and not path.is_dir():
        raise DatabaseError(f"database {spec} is not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise DatabaseError(f"database {spec} cannot be made: {error.strerror or error}") from None
    return DirectoryBasedExampleDatabase(str(path))


def database_key(suite: str, part: str, engine_spec: str) -> bytes:
    """The key a suite's examples for one engine live under: the same in every process and on
    every machine (Hypothesis' own key digests the test function, which kvoracle makes anew
    for each run)."""
    return hashlib.sha256(f"kvoracle\0{suite}\0{part}\0{engine_spec}".encode()).digest()
