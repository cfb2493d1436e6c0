"""`python -m openjet_launcher.engine [--compact]`: prints the device probe's report as JSON."""

import sys

from .device_probe import main

sys.exit(main())
