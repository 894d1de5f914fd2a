"""Durable checkpoint stores: the exactly-once protocol on a real database.

- :mod:`runlet.stores.sqlite`: :class:`~runlet.stores.sqlite.SQLiteCheckpointStore`, one
  file on one machine, standard library only.
- :mod:`runlet.stores.postgres`: :class:`~runlet.stores.postgres.PostgresCheckpointStore`,
  many workers on many machines (``pip install "runlet[postgres]"``).

Import the module of the store you use; this package imports neither, so a missing
PostgreSQL driver costs nothing to SQLite users. Both are async context managers::

    async with SQLiteCheckpointStore("checkpoints.db") as store:
        runtime = Runtime(checkpoint_store=store)
        ...
"""
