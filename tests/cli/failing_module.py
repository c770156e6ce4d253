"""A module that fails when imported: ``dcp worker`` must say so in one line (issue 25,
finding 5; :mod:`dcp._cli._worker` Rule CW1)."""

raise RuntimeError("this module fails on import")
