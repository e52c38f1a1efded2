"""Generates the protobuf/gRPC modules from protos/ whenever the package is built.

The generated files are never committed or edited: every wheel, sdist and editable
install runs protoc from the pinned grpcio-tools in the build environment.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).parent
PROTO_ROOT = HERE / "protos"


def generate_protos(out_dir: Path) -> None:
    import grpc_tools
    from grpc_tools import protoc

    include = Path(grpc_tools.__file__).parent / "_proto"
    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.rglob("*.proto"))
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
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
