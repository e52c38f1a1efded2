import sys

from guestagent.cli import agent_main

sys.exit(agent_main())
