"""Where the dispatcher forwards a request.

- :mod:`.remote` -- the MIP and Clipper model servers a device row names;
- :mod:`.local` -- those servers started on this machine (``wirekit serve --with-backends``).
"""
