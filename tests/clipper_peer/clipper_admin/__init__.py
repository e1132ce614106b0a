"""A stand-in for Clipper's ``clipper_admin`` package: only the ``metrics`` module that
``rpc.py`` (v3) imports.  Written for these tests; it is not Clipper's code."""
