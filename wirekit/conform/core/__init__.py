"""The case model and the runner of ``wirekit conform``."""
