import sys

from guestagent.agent.entry import entry

sys.exit(entry())
