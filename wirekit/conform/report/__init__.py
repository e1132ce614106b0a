"""How ``wirekit conform`` reports: a table for people, JSON and JUnit XML for machines."""

from __future__ import annotations

from .document import to_document
from .junit import nothing_connected_junit, to_junit
from .table import render_table

__all__ = ["nothing_connected_junit", "render_table", "to_document", "to_junit"]
