import sys

from policies.cli import main

sys.exit(main())
