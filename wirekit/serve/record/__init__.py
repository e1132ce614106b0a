"""The record of every request: one row from arrival to its end, durable through a crash.

- :mod:`.store` -- the requests store and its journal (arrivals and answers, written before
  the request leaves or the answer goes back; replayed at start);
- :mod:`.storedb` -- the database under it: SQLite or PostgreSQL;
- :mod:`.pgsync` / :mod:`.replicas` -- several replicas on one PostgreSQL store: the models
  metadata they share, the leader, the change log, each replica's lease (a dead replica's
  unfinished rows end ``lost``).
"""
