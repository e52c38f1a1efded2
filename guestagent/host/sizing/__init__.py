"""VM sizing on the host: the overhead model, the plan rules, and the plan as text.

`model` fits and stores what a VM costs beyond its containers, `plan` applies a runtime's
sizing rules and the host's pod limit to it, `text` renders the result. All pure.
"""

from guestagent.host.sizing.model import (
    DEFAULT_MODEL,
    MIB,
    MODEL_FORMAT,
    Line,
    OverheadModel,
    OverheadSample,
    ceil_mib,
    fit_line,
    fit_model,
    mib_text,
    model_from_dict,
    model_to_dict,
)
from guestagent.host.sizing.plan import (
    DEFAULT_BLOCK_SIZE,
    Container,
    Hotplug,
    Plan,
    PodSizing,
    hotplug_amount,
    plan,
    round_down,
    round_up,
    validate,
    vm_ceiling,
)
from guestagent.host.sizing.text import plan_text, plan_to_dict, verdict_text

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "DEFAULT_MODEL",
    "MIB",
    "MODEL_FORMAT",
    "Container",
    "Hotplug",
    "Line",
    "OverheadModel",
    "OverheadSample",
    "Plan",
    "PodSizing",
    "ceil_mib",
    "fit_line",
    "fit_model",
    "hotplug_amount",
    "mib_text",
    "model_from_dict",
    "model_to_dict",
    "plan",
    "plan_text",
    "plan_to_dict",
    "round_down",
    "round_up",
    "validate",
    "verdict_text",
    "vm_ceiling",
]
