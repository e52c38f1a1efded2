"""VM sizing on the host: the overhead model, the plan rules, and the plan as text.

`model` fits and stores what a VM costs beyond its containers, `survey` carries the published
figures for confidential guests and their fitted models, `plan` applies a runtime's sizing
rules and the host's pod limit to it, `text` renders the result. All pure.
"""
