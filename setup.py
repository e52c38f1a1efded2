"""Generates the protobuf/gRPC modules from protos/ whenever the package is built.

The generated files are never committed or edited: every wheel, sdist and editable
install runs protoc from the pinned grpcio-tools in the build environment.
"""

import shutil
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).parent
PROTO_ROOT = HERE / "protos"


def protoc_plugin(name: str) -> str:
    """A protoc plugin installed beside this interpreter (a venv or pip's build environment)."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} not found: the build needs mypy-protobuf (build-system)")
    return found


def generate_protos(out_dir: Path) -> None:
    import grpc_tools
    from grpc_tools import protoc

    include = Path(grpc_tools.__file__).parent / "_proto"
    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.rglob("*.proto"))
    # mypy-protobuf writes the .pyi stubs for both the messages and the gRPC module, so
    # mypy --strict checks the servicer and the client against the contract, not Any.
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--plugin=protoc-gen-mypy={protoc_plugin('protoc-gen-mypy')}",
        f"--plugin=protoc-gen-mypy_grpc={protoc_plugin('protoc-gen-mypy_grpc')}",
        f"--python_out={out_dir}",
        f"--mypy_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        f"--mypy_grpc_out={out_dir}",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed: {' '.join(args)}")


class BuildWithProtos(build_py):
    def run(self) -> None:
        # Into the source tree (git-ignored): editable installs import from there, and
        # build_py then copies the modules into wheels like any other source file.
        generate_protos(HERE)
        super().run()


if __name__ == "__main__":  # setuptools runs this file as __main__; `make protos` imports it.
    setup(cmdclass={"build_py": BuildWithProtos})
