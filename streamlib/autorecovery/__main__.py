"""``python -m streamlib.autorecovery ARGS``: the daemon, as ``streamlib autorecovery
ARGS`` (how ``bookie serve --autorecovery`` starts it without importing streamlib)."""

import sys

from streamlib.autorecovery.cli import main

sys.exit(main(["autorecovery", *sys.argv[1:]]))
