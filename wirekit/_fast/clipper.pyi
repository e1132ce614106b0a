"""Type stub of the Cython twin of ``wirekit.clipper._pure`` (the Clipper codec)."""

from typing import Any

from wirekit.clipper.messages import Message

def decode(frames: Any, generation: Any, direction: Any) -> Message: ...
def encode(msg: Message, generation: Any) -> list[bytes]: ...
