import sys

from sdm.cli import main

sys.exit(main())
