"""``python -m fairshare_cli``: the same as the ``fairshare`` console script."""

import sys

from fairshare_cli.main import main

sys.exit(main())
