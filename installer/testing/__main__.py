"""`python -m installer.testing NODE DIR` writes a sample node's host tree (see `make sample`)."""

import sys

from installer.testing import main

sys.exit(main(sys.argv[1:]))
