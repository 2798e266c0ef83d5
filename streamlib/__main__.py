"""`python -m streamlib ...` is the `streamlib` command."""

import sys

from streamlib.cli import main

sys.exit(main())
