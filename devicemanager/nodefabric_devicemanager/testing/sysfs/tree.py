"""The ground a sysfs tree is built on: a host root, files, relative symlinks, and hostile entries
(a named pipe, a character device) where a file should be."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from nodefabric_devicemanager.hostroot import HostRoot


@dataclass
class Tree:
    root: Path

    @property
    def host(self) -> HostRoot:
        return HostRoot.at(self.root)

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        for d in ("sys/bus/pci/devices", "sys/class/net", "sys/devices/virtual/net", "dev"):
            self.mkdir("/" + d)

    def path(self, host_path: str) -> Path:
        return self.root / host_path.lstrip("/")

    def mkdir(self, host_path: str) -> Path:
        p = self.path(host_path)
        p.mkdir(parents=True, exist_ok=True)
        return p

    def write(self, host_path: str | Path, content: str | bytes) -> Path:
        p = host_path if isinstance(host_path, Path) else self.path(host_path)
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            p.write_bytes(content)
        else:
            p.write_text(content if content.endswith("\n") else content + "\n")
        return p

    def link(self, host_path: str | Path, target: str | Path) -> Path:
        """A relative symlink at `host_path` pointing at `target` (host-absolute str or a real Path)."""
        p = host_path if isinstance(host_path, Path) else self.path(host_path)
        t = target if isinstance(target, Path) else self.path(target)
        p.parent.mkdir(parents=True, exist_ok=True)
        if p.is_symlink():
            p.unlink()
        p.symlink_to(os.path.relpath(t, p.parent))
        return p

    def attrs(self, directory: Path, values: dict[str, str | bytes]) -> None:
        for name, value in values.items():
            self.write(directory / name, value)

    def _replace(self, host_path: str | Path) -> Path:
        p = host_path if isinstance(host_path, Path) else self.path(host_path)
        p.parent.mkdir(parents=True, exist_ok=True)
        if p.is_symlink() or p.is_file():
            p.unlink()
        return p

    def fifo(self, host_path: str | Path) -> Path:
        """A named pipe where a file should be (replacing it): a blocking open of it never returns."""
        p = self._replace(host_path)
        os.mkfifo(p)
        return p

    def chardev(self, host_path: str | Path) -> Path:
        """A character device node (1:3, what /dev/null is) where a file should be. Needs CAP_MKNOD."""
        p = self._replace(host_path)
        os.mknod(p, stat.S_IFCHR | 0o600, os.makedev(1, 3))
        return p
