"""The kernel's boot id: which boot a claim was prepared in.

A prepared claim's CDI spec names device nodes (`/dev/infiniband/uverbsN`) and RDMA device names
(`mlx5_3`, in `NCCL_IB_HCA`) that the kernel numbers at each boot, in probe order: after a reboot the
same NIC may be another uverbs node and RDMA name. Each checkpoint entry records the boot it was
prepared in, so a repeated prepare after a reboot resolves the claim's devices again (see prepare).

Read once, at the driver's start (a boot does not change while the process runs): from the host root's
`/proc/sys/kernel/random/boot_id`, else, when the host root has no `/proc` at all (the chart mounts only
`/sys` and `/dev` under it), from the process's own: the boot id is the kernel's, the same from every
mount and PID namespace. Anything that is not a boot id (absent, refused, too large, garbage) is unknown
(""), never an error: prepare then treats every entry as possibly from another boot when its spec is gone.
"""

from __future__ import annotations

import logging
import re

from nodefabric_devicemanager.hostroot import HostRoot

log = logging.getLogger(__name__)

DIRECTORY = "/proc/sys/kernel/random"
NAME = "boot_id"
UNKNOWN = ""
# What the kernel writes: a random UUID, lower-case hex, one newline (stripped by the read).
_BOOT_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def parse(text: str) -> str:
    """The boot id in what the file held, or UNKNOWN when it is not one."""
    return text if _BOOT_ID.fullmatch(text) else UNKNOWN


def current(host: HostRoot) -> str:
    """This boot's id as seen through `host` (UNKNOWN when it cannot be read or is not a boot id).
    Capped, non-blocking read (`HostRoot`): a FIFO or a huge file there is refused, not waited on."""
    source = host if host.present("/proc") else HostRoot.at("/")
    path = f"{DIRECTORY}/{NAME}"
    try:
        text = source.dir(DIRECTORY).read(NAME)
    except (OSError, ValueError) as exc:
        log.warning(
            "the kernel's boot id cannot be read; a prepared claim whose CDI spec is gone will be resolved"
            " again",
            extra={"path": source.display(source.host_path(path)), "why": str(exc)},
        )
        return UNKNOWN
    boot = parse(text)
    if boot == UNKNOWN:
        log.warning(
            "the kernel's boot id is not a boot id; a prepared claim whose CDI spec is gone will be"
            " resolved again",
            extra={"path": source.display(source.host_path(path)), "value": text[:80]},
        )
    return boot
