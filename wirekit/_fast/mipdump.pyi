"""Type stub of the Cython twin of ``wirekit.mip.dump.format_run_pure`` (``wirekit dump``'s
text and JSON lines of a run of MIP frames)."""

def format_run(
    buf: bytes, pos: int, stop: int, base: int, as_json: bool
) -> tuple[bytes, int, int]: ...
