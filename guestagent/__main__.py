import sys

from guestagent.cli import main

sys.exit(main())
