# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Compiled twin of ``wirekit.serve.record.writer.merge_ops`` (the writer thread's statements
of one hand-over); ``tests/test_serve_journal.py`` checks it against the pure one."""

cdef int _ARRIVAL = 0
cdef tuple _QUEUED_TAIL = (None, None, "queued", 0)


def merge_ops(list ops, Py_ssize_t chunk):
    """One hand-over of the store as statements (see ``wirekit.serve.record.writer.merge_ops``):
    the INSERT rows ``chunk`` at a time, flattened, the rows left over, the UPDATEs.
    :class:`ValueError` when ``chunk`` is below 1 (checked before the modulo: cdivision)."""
    if chunk < 1:
        raise ValueError(f"merge_ops: chunk must be at least 1, not {chunk}")
    cdef dict rows = {}
    cdef list updates = [], inserts, chunks = [], flat
    cdef tuple op, row, arrived
    cdef Py_ssize_t i, j, full
    cdef object rid
    for op in ops:
        row = <tuple>op[1]
        if op[0] == _ARRIVAL:
            rows[row[0]] = row + _QUEUED_TAIL
        else:
            rid = row[4]
            arrived = rows.get(rid)
            if arrived is not None:
                rows[rid] = arrived[:6] + row[:4]
            else:
                updates.append(row)
    inserts = list(rows.values())
    full = len(inserts) - len(inserts) % chunk
    for i in range(0, full, chunk):
        flat = []
        for j in range(i, i + chunk):
            flat.extend(<tuple>inserts[j])
        chunks.append(tuple(flat))
    return chunks, inserts[full:], updates
