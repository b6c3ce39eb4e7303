"""``python -m fleetmedic.devenv ...`` is ``fleetmedic dev ...``."""

from __future__ import annotations

import sys

from fleetmedic.devenv.cli import main

sys.exit(main())
