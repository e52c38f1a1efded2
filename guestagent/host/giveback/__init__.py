"""Giving a guest's memory back to the host through its VMM: the step decided from the agent's
figures (`plan.py`), the one-shot command that takes it and waits for the device
(`oneshot.py`, its text in `text.py`), and `--follow`, which keeps the device at the figure as
it moves (`follow.py`, its Prometheus series in `follow_metrics.py`)."""
