# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Compiled twin of the batch writers of ``wirekit.serve.record.journal``
(``arrival_records``, ``ok_records``): the same records, byte for byte, as the module's
table-derived writer; ``tests/test_serve_journal.py`` checks them against it."""

import json

cdef int _ARRIVAL = 0, _COMPLETION = 1
cdef object _json_str = json.encoder.encode_basestring_ascii
cdef object _json_time = None, _json_num = None, _json_blob = None
cdef str _OK_JSON = '"ok"'
cdef str _QUEUED_JSON = '"queued"'


def bind(json_time, json_num, json_blob):
    """The journal's field writers (``wirekit.serve.record.journal``), for the values the
    fast paths below do not write themselves (non-float times, non-int counts, payloads)."""
    global _json_time, _json_num, _json_blob
    _json_time, _json_num, _json_blob = json_time, json_num, json_blob


cdef inline str _time_text(object t):
    cdef double v
    if type(t) is float:
        v = t
        if v - v == 0:  # finite
            return '"' + float.hex(t) + '"'
    return _json_time(t)


def arrival_records(list requests, str model, str client, object time_in, str names,
                    str tin, bint journal, bint payloads):
    """The arrival records, their length and the arrival rows of ``RequestStore.arrivals``
    (see ``journal.arrival_records``): one call for the requests of one read."""
    cdef list lines = [], ops = []
    cdef Py_ssize_t nbytes = 0
    cdef object rid, size, wire
    cdef str line, blob
    cdef tuple r
    for r in requests:
        rid, size, wire = r
        if payloads and wire is not None:
            wire = bytes(wire)
        else:
            wire = None
        if journal:
            blob = "null" if wire is None else _json_blob(wire)
            line = (f"[{_json_str(rid)},{names}{tin},null,{_QUEUED_JSON},"
                    f"{size if type(size) is int else _json_num(size)},0,{blob}]\n")
            nbytes += len(line)
            lines.append(line)
        ops.append((_ARRIVAL, (rid, model, client, time_in, size, wire)))
    return lines, nbytes, ops


# the time in of no answer yet (None is a time in that must still be written: null)
cdef object _NO_TIME = object()


def ok_records(list answers, object time_out, str tout, object names_of, bint journal,
               bint payloads):
    """The records, their length and the completion rows of
    ``RequestStore.completions_ok`` (see ``journal.ok_records``)."""
    cdef list lines = [], ops = []
    cdef Py_ssize_t nbytes = 0
    cdef dict names = {}
    cdef object last = _NO_TIME, rid, device, t_in, size, attempts, wire
    cdef str tin = "", text, line, blob
    cdef tuple a
    for a in answers:
        rid, device, t_in, size, attempts, wire = a
        if journal:
            text = names.get(device)
            if text is None:
                text = names_of(device)
                names[device] = text
            if t_in is not last:  # the requests of one read share their time
                last = t_in
                tin = _time_text(t_in)
            if payloads and wire is not None:
                blob = _json_blob(wire)
            else:
                blob = "null"
            line = (f"[{_json_str(rid)},{text}{tin},{tout},{_OK_JSON},"
                    f"{size if type(size) is int else _json_num(size)},"
                    f"{attempts if type(attempts) is int else _json_num(attempts)},{blob}]\n")
            nbytes += len(line)
            lines.append(line)
        ops.append((_COMPLETION, (device, time_out, "ok", attempts, rid)))
    return lines, nbytes, ops
