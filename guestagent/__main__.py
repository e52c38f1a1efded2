import sys

from guestagent.agent.cli import entry

sys.exit(entry())
