"""VM sizing on the host: the overhead model, the plan rules, the plan as text, and the
measurement the model is fitted to.

`model` fits and stores what a VM costs beyond its containers, `survey` carries the published
figures for confidential guests and their fitted models, `plan` applies a runtime's sizing
rules and the host's pod limit to it, `text` renders the result: all pure. `measure` boots
the guest image at several sizes (`boot`: QEMU, the agent, and their stop) and reads what
each costs.
"""
