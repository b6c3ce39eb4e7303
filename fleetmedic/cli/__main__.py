"""``python -m fleetmedic.cli``."""

import sys

from fleetmedic.cli.main import main

sys.exit(main())
