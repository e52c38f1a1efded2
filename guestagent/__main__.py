import sys

from guestagent.agent.cli import main

sys.exit(main())
