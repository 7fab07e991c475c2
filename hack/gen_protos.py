"""Regenerate the committed kubelet device-plugin stubs from deviceplugin/.../api/deviceplugin.proto.

    python hack/gen_protos.py            # rewrite the committed stubs in place
    python hack/gen_protos.py --out DIR  # write them under DIR instead (the staleness test uses this)

The proto is compiled from the `deviceplugin/` source root so the generated gRPC module imports its
messages as `nodefabric_deviceplugin.api.deviceplugin_pb2`, not as a top-level module.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from grpc_tools import protoc

REPO = Path(__file__).resolve().parent.parent
SOURCE_ROOT = REPO / "deviceplugin"
PROTO = "nodefabric_deviceplugin/api/deviceplugin.proto"
GENERATED = ("deviceplugin_pb2.py", "deviceplugin_pb2.pyi", "deviceplugin_pb2_grpc.py")


def generate(out_root: Path) -> list[Path]:
    """Compile the proto into `out_root/nodefabric_deviceplugin/api/`; return the generated files."""
    (out_root / Path(PROTO).parent).mkdir(parents=True, exist_ok=True)
    rc = protoc.main(
        [
            "grpc_tools.protoc",
            f"--proto_path={SOURCE_ROOT}",
            f"--python_out={out_root}",
            f"--pyi_out={out_root}",
            f"--grpc_python_out={out_root}",
            str(SOURCE_ROOT / PROTO),
        ]
    )
    if rc != 0:
        raise SystemExit(f"protoc failed with exit status {rc}")
    paths = [out_root / Path(PROTO).parent / name for name in GENERATED]
    # The lint configuration excludes generated *.py but not the stub, and `make test` lints everything;
    # mypy still follows imports into the generated gRPC module, whose typed face is rpc.py.
    stub, services = paths[1], paths[2]
    stub.write_text("# ruff: noqa\n# mypy: ignore-errors\n" + stub.read_text())
    services.write_text("# mypy: ignore-errors\n" + services.read_text())
    subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--quiet", "--config", str(REPO / "pyproject.toml"), stub],
        check=True,
    )
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=SOURCE_ROOT, help="source root to write under")
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
