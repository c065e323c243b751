import sys

from egfuse.cli import main

sys.exit(main())
