"""The VMMs' published schemas (openapi/*.json: the named schemas and all they reference,
extracted unchanged from each project's API document at the commit its `source` names) and
a check of a body against one.

Both VMMs deserialize with serde, which ignores a field it does not know: a misspelt field
would pass their schemas and do nothing. So `check` also refuses a field the schema does
not declare; that strictness is this project's, not the documents'.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft4Validator  # type: ignore[import-untyped]

from tests.standins.server import Received

HERE = Path(__file__).parent / "openapi"
CLOUD_HYPERVISOR, FIRECRACKER = "cloud-hypervisor", "firecracker"


@cache
def document(vmm: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((HERE / f"{vmm}.json").read_text())
    return loaded


def schema_of(vmm: str, name: str) -> dict[str, Any]:
    doc = document(vmm)
    if vmm == CLOUD_HYPERVISOR:
        return {"$ref": f"#/components/schemas/{name}", "components": doc["components"]}
    return {"$ref": f"#/definitions/{name}", "definitions": doc["definitions"]}


def declared(vmm: str, name: str) -> set[str]:
    doc = document(vmm)
    schemas = doc["components"]["schemas"] if vmm == CLOUD_HYPERVISOR else doc["definitions"]
    return set(schemas[name].get("properties", {}))


def errors(vmm: str, name: str, body: Any) -> list[str]:
    """What is wrong with body as the schema `name`; [] when it conforms."""
    found = [e.message for e in Draft4Validator(schema_of(vmm, name)).iter_errors(body)]
    if isinstance(body, dict):
        found += [
            f"{key!r} is not a field of {name}" for key in body if key not in declared(vmm, name)
        ]
    return found


# The schema each request body a stand-in accepts must follow, by (method, path).
REQUESTS = {
    CLOUD_HYPERVISOR: {
        ("PUT", "/api/v1/vm.resize"): "VmResize",
        ("PUT", "/api/v1/vm.resize-zone"): "VmResizeZone",
    },
    FIRECRACKER: {
        ("PATCH", "/balloon"): "BalloonUpdate",
        ("PATCH", "/hotplug/memory"): "MemoryHotplugSizeUpdate",
    },
}
# And the schema of each answer a stand-in gives.
ANSWERS = {
    CLOUD_HYPERVISOR: {("GET", "/api/v1/vm.info"): "VmInfo"},
    FIRECRACKER: {
        ("GET", "/machine-config"): "MachineConfiguration",
        ("GET", "/balloon"): "Balloon",
        ("GET", "/balloon/statistics"): "BalloonStats",
        ("GET", "/hotplug/memory"): "MemoryHotplugStatus",
    },
}


def request_errors(vmm: str, method: str, path: str, body: Any) -> list[str]:
    """A request with a body the VMM defines none for, or a body that breaks the schema."""
    name = REQUESTS[vmm].get((method, path))
    if name is None:
        return [] if body is None else [f"{method} {path} takes no body, got {body!r}"]
    return [f"{method} {path}: {e}" for e in errors(vmm, name, body)]


def received_errors(vmm: str, received: Iterable[Received]) -> list[str]:
    """request_errors of every request a stand-in received; [] when all conform."""
    return [e for r in received for e in request_errors(vmm, r.method, r.path, r.body)]
