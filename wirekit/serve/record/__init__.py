"""The record of every request: one row from arrival to its end, durable through a crash.

- :mod:`.store` -- the requests store: the row API the dispatcher calls (arrivals and
  answers, journaled before the request leaves or the answer goes back);
- :mod:`.journal` -- the journal record (declared once), its writers and reader
  (specs/journal.md);
- :mod:`.replay` -- the journal files read back: the replay at start, the quarantine;
- :mod:`.writer` -- the writer thread: each hand-over of rows in one transaction;
- :mod:`.decisions` -- the controller's decisions, a table of their own;
- :mod:`.storedb` -- the database under it: SQLite or PostgreSQL;
- :mod:`.pgsync` / :mod:`.replicas` -- several replicas on one PostgreSQL store: the models
  metadata they share, the leader, the change log, each replica's lease (a dead replica's
  unfinished rows end ``lost``).
"""
