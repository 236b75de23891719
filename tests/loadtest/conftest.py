"""The `loadtest` package lives at the repository root and is not installed (only `proxy`
is): put the root on sys.path so these tests import it however pytest is started."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
