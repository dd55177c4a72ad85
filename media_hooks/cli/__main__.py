import sys

from media_hooks.cli import main

sys.exit(main())
