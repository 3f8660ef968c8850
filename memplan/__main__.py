import sys

from memplan.cli import main

sys.exit(main())
