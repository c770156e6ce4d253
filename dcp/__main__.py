"""``python -m dcp``: the same as the ``dcp`` command."""

from __future__ import annotations

import sys

from dcp._cli import main

sys.exit(main())
