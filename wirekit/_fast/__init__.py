"""Cython twins of the pure codecs; import them through the protocol facades, not directly."""
