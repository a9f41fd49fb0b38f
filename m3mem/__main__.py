import sys

from m3mem.cli import main

sys.exit(main())
