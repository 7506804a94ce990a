"""``python -m fairshare`` runs the command line."""

import sys

from fairshare.cli import main

sys.exit(main())
