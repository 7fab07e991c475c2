"""Regenerate the committed kubelet gRPC stubs from the .proto files under deviceplugin/.

    python hack/gen_protos.py            # rewrite the committed stubs in place
    python hack/gen_protos.py --out DIR  # write them under DIR instead
    python hack/gen_protos.py --check    # exit 1 naming every committed stub that is stale

The protos are compiled from the `deviceplugin/` source root so each generated gRPC module imports its
messages by package path (`nodefabric_deviceplugin.api.deviceplugin_pb2`), not as a top-level module.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

REPO = Path(__file__).resolve().parent.parent
SOURCE_ROOT = REPO / "deviceplugin"
# The device-plugin API, and the DRA driver's: kubelet plugin registration and both DRAPlugin versions.
PROTOS = (
    "nodefabric_deviceplugin/api/deviceplugin.proto",
    "nodefabric_deviceplugin/dra/api/pluginregistration.proto",
    "nodefabric_deviceplugin/dra/api/dra_v1.proto",
    "nodefabric_deviceplugin/dra/api/dra_v1beta1.proto",
)


def generated(proto: str) -> tuple[str, str, str]:
    """The three files protoc writes for one proto, relative to the source root."""
    stem = proto.removesuffix(".proto")
    return (f"{stem}_pb2.py", f"{stem}_pb2.pyi", f"{stem}_pb2_grpc.py")


def _compile(proto: str, out_root: Path) -> list[Path]:
    (out_root / Path(proto).parent).mkdir(parents=True, exist_ok=True)
    rc = protoc.main(
        [
            "grpc_tools.protoc",
            f"--proto_path={SOURCE_ROOT}",
            f"--python_out={out_root}",
            f"--pyi_out={out_root}",
            f"--grpc_python_out={out_root}",
            str(SOURCE_ROOT / proto),
        ]
    )
    if rc != 0:
        raise SystemExit(f"protoc failed on {proto} with exit status {rc}")
    paths = [out_root / name for name in generated(proto)]
    # The lint configuration excludes generated *.py but not the stub, and `make test` lints everything;
    # mypy still follows imports into the generated gRPC module, whose typed face is an rpc.py.
    stub, services = paths[1], paths[2]
    stub.write_text("# ruff: noqa\n# mypy: ignore-errors\n" + stub.read_text())
    services.write_text("# mypy: ignore-errors\n" + services.read_text())
    subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--quiet", "--config", str(REPO / "pyproject.toml"), stub],
        check=True,
    )
    return paths


def generate(out_root: Path) -> list[Path]:
    """Compile every proto under `out_root`; return the generated files."""
    return [path for proto in PROTOS for path in _compile(proto, out_root)]


# Version stamps of the generator itself: a newer grpcio-tools must not read as a changed proto.
_STAMPS = [
    (re.compile(r"ValidateProtobufRuntimeVersion\(.*?\)", re.S), "ValidateProtobufRuntimeVersion(...)"),
    (re.compile(r"Protobuf Python Version: .*"), "Protobuf Python Version: ..."),
    (re.compile(r"GRPC_GENERATED_VERSION = .*"), "GRPC_GENERATED_VERSION = ..."),
]


def unstamped(text: str) -> str:
    for pattern, replacement in _STAMPS:
        text = pattern.sub(replacement, text)
    return text


def stale() -> list[str]:
    """The committed stubs that differ from what the committed protos generate (stamps aside)."""
    with tempfile.TemporaryDirectory() as out:
        generate(Path(out))
        return [
            name
            for proto in PROTOS
            for name in generated(proto)
            if unstamped((Path(out) / name).read_text()) != unstamped((SOURCE_ROOT / name).read_text())
        ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=SOURCE_ROOT, help="source root to write under")
    parser.add_argument("--check", action="store_true", help="only say which committed stubs are stale")
    args = parser.parse_args(argv)
    if args.check:
        names = stale()
        for name in names:
            print(f"{name} is stale: run `make protos`", file=sys.stderr)
        return 1 if names else 0
    for path in generate(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
