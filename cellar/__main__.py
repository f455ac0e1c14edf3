"""`python -m cellar` runs the command line."""

import sys

from cellar.cli import main

sys.exit(main())
