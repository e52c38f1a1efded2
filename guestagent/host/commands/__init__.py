"""guestctl's commands, by group: one call to the agent each (`agent.py`), give-back
(`giveback.py`), the metrics endpoint (`metrics.py`) and sizing (`sizing.py`), on what they
share (`common.py`: flag types, the agent wrapper, how an answer is printed). ctl.py makes
them one command line."""
