import sys

from egfuse.commands.cli import main

sys.exit(main())
