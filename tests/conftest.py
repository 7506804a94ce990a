"""Suite-wide test settings.

Under CI (``CI`` set and not 0/false/no; .ci/run sets it) hypothesis runs derandomized
and without deadlines: the same examples every run on a shared 2-core machine, so a red
CI means a regression, not a newly drawn example or a slow moment. Locally it keeps
exploring at random, and every failure it finds is printed with a reproduction blob (then
pinned as a table case).
"""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
settings.register_profile("dev", print_blob=True)
CI = os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")
settings.load_profile("ci" if CI else "dev")
