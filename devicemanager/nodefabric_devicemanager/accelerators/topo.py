"""A parser of `nvidia-smi topo -m` text into the same link matrix the record carries.

The matrix is tab-separated; the header may be wrapped in ANSI underline codes; cells are X, NV<n>,
PIX, PXB, PHB, NODE, SYS (older drivers print SOC for SYS); GPU rows end with CPU Affinity, NUMA
Affinity and GPU NUMA ID columns (drivers print an extra empty cell before the last one); NIC rows end
after their link cells; a `NIC Legend:` block maps NICn to its RDMA device (mlx5_N). Drivers before the
legend name NIC columns and rows by the RDMA device itself (`mlx5_0`), so a device column is any header
name that also labels a row, not only GPUn/NICn.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from nodefabric_devicemanager.pick import known_link

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# fullmatch and ASCII digits: `$` accepts a trailing newline, and `\d` an Arabic-Indic digit int() reads.
_GPU = re.compile(r"GPU([0-9]{1,4})", re.ASCII)
_DEVICE = re.compile(r"(GPU|NIC)[0-9]{1,4}", re.ASCII)
_LEGEND = re.compile(r"\s*(NIC[0-9]{1,4})\s*:\s*(\S+)\s*", re.ASCII)
_ALIASES = {"SOC": "SYS", "CPU": "PHB"}  # names older drivers printed
_AFFINITY_COLUMNS = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")


class TopoParseError(ValueError):
    """The text is not `nvidia-smi topo -m` output, or a cell is outside the link vocabulary."""


class TooManyGpus(TopoParseError):
    """The header names more GPUs than the caller takes: said before a cell is read."""

    def __init__(self, gpus: int, limit: int) -> None:
        super().__init__(f"the matrix header names {gpus} GPUs, more than {limit}")
        self.gpus = gpus


@dataclass
class TopoMatrix:
    gpus: list[int] = field(default_factory=list)
    # GPU index -> peer GPU index -> link ("NV18", "PIX", ...); self is left out.
    links: dict[int, dict[int, str]] = field(default_factory=dict)
    # GPU index -> NIC name (legend name such as mlx5_0, else NICn) -> link
    nic_links: dict[int, dict[str, str]] = field(default_factory=dict)
    nics: dict[str, str] = field(default_factory=dict)  # NICn -> mlx5_N from the legend
    cpu_affinity: dict[int, str] = field(default_factory=dict)
    numa_affinity: dict[int, str] = field(default_factory=dict)  # "" when N/A
    gpu_numa_id: dict[int, str] = field(default_factory=dict)  # "" when N/A

    def wire_links(self, gpu: int) -> dict[str, str]:
        """One GPU's links in the record's shape (peer index as a string)."""
        return {str(peer): link for peer, link in sorted(self.links.get(gpu, {}).items())}


def _clean(text: str) -> str:
    return _ANSI.sub("", text)


def _blank(value: str) -> str:
    value = value.strip()
    return "" if value.upper() in ("N/A", "NA", "-1") else value


def _cell(raw: str, where: str) -> str:
    value = raw.strip().upper()
    value = _ALIASES.get(value, value)
    # ASCII before upper(): "p\u0131x" upper-cases to PIX.
    if raw.isascii() and (value == "X" or known_link(value)):
        return value
    raise TopoParseError(
        f"{where}: {raw.strip()!r} is not a link (expected X, NV<n>, PIX, PXB, PHB, NODE, SYS)"
    )


SPELLINGS = 256  # a real matrix spells its cells a handful of ways (SYS, NV18, sys, padded or not)


def _judged(judged: dict[str, str], raw: str, where: str) -> str:
    """A cell's link, remembered for the cells spelled the same while fewer than SPELLINGS are."""
    link = _cell(raw, where)
    if len(judged) < SPELLINGS:
        judged[raw] = link
    return link


def _header(lines: list[str]) -> tuple[int, list[str], list[str]]:
    """(line index, device columns, affinity columns) of the matrix header. Device columns are the
    leading GPUn/NICn names, and an older driver's mlx5_N, recognised by labelling a row below."""
    header_at = next(
        (i for i, line in enumerate(lines) if "GPU0" in [c.strip() for c in line.split("\t")]),
        None,
    )
    if header_at is None:
        raise TopoParseError("no matrix header (a tab-separated line naming GPU0) in the input")
    header = [c.strip() for c in lines[header_at].split("\t")]
    if header and header[0] == "":
        header = header[1:]
    labels = {line.split("\t", 1)[0].strip() for line in lines[header_at + 1 :]}
    columns: list[str] = []
    for name in header:
        if not _DEVICE.fullmatch(name) and (name not in labels or name in _AFFINITY_COLUMNS):
            break
        columns.append(name)
    affinity = [c for c in header[len(columns) :] if c]
    unknown = [c for c in affinity if c not in _AFFINITY_COLUMNS]
    if unknown:
        more = f" ({len(unknown):,} in all)" if len(unknown) > 8 else ""
        raise TopoParseError(f"line {header_at + 1}: unexpected header column(s) {unknown[:8]}{more}")
    # Counted in one pass: columns.count per column hung on a header of 100,000 GPU0s.
    twice = sorted(c for c, n in Counter(columns).items() if n > 1)
    if twice:
        raise TopoParseError(f"line {header_at + 1}: column(s) {twice[:8]} named twice")
    # GPU0 and GPU00 are two names of one device: either column's cells would be a guess.
    gpus = Counter(int(m[1]) for c in columns if (m := _GPU.fullmatch(c)))
    same = sorted(i for i, n in gpus.items() if n > 1)
    if same:
        raise TopoParseError(f"line {header_at + 1}: GPU {same[0]} is named by two columns")
    return header_at, columns, affinity


def _gpu_row(out: TopoMatrix, name: str, links: list[str], columns: list[str]) -> None:
    gpu = int(name[3:])
    if gpu in out.links:
        raise TopoParseError(f"{name}: a second row for GPU {gpu}")
    if name in columns and links[columns.index(name)] != "X":
        raise TopoParseError(f"{name}: its own cell is {links[columns.index(name)]!r}, expected X")
    peers: dict[int, str] = {}
    nics: dict[str, str] = {}
    for col, link in zip(columns, links, strict=True):
        if col == name:
            continue
        if link == "X":
            raise TopoParseError(f"{name}/{col}: X marks a device's own cell only")
        if m := _GPU.fullmatch(col):
            peers[int(m[1])] = link
        else:
            nics[out.nics.get(col, col)] = link
    out.gpus.append(gpu)
    out.links[gpu] = peers
    out.nic_links[gpu] = nics


def parse(text: str, max_gpus: int | None = None) -> TopoMatrix:
    """The matrix, affinities and NIC legend of `nvidia-smi topo -m` output. Raises TopoParseError;
    TooManyGpus when the header names more than `max_gpus` GPUs, before any cell is read (reading every
    cell of a 16 MiB matrix first took seconds)."""
    lines = [_clean(line).rstrip("\r\n") for line in text.splitlines()]
    header_at, columns, affinity = _header(lines)
    gpus = sum(1 for c in columns if _GPU.fullmatch(c))
    if max_gpus is not None and gpus > max_gpus:
        raise TooManyGpus(gpus, max_gpus)
    out = TopoMatrix()
    # A matrix of a thousand VF NICs is a million cells, spelled a handful of ways: each spelling is
    # judged once (its first place named when refused), then looked up (a call per cell took a second);
    # the first SPELLINGS only, so a file of a million spellings costs no more than judging every cell.
    judged: dict[str, str] = {}
    rows: dict[str, list[str]] = {}
    row_at: dict[str, int] = {}
    end = len(lines)
    for line_no, line in enumerate(lines[header_at + 1 :], start=header_at + 2):
        cells = line.split("\t")
        name = cells[0].strip()
        if not _DEVICE.fullmatch(name) and name not in columns:
            end = line_no - 1  # the matrix ends at the first line that is not a device row
            break
        if len(cells) - 1 < len(columns):
            raise TopoParseError(
                f"line {line_no}: {name} has {len(cells) - 1} cells, the header names {len(columns)}"
            )
        if name in row_at:
            # Two rows for one device cannot both be its links: keeping either would be a guess.
            first = row_at[name]
            raise TopoParseError(f"line {line_no}: a second row for {name} (the first is line {first})")
        row_at[name] = line_no
        raw = cells[1 : 1 + len(columns)]
        try:
            rows[name] = list(map(judged.__getitem__, raw))
        except KeyError:  # a spelling not judged yet
            rows[name] = [
                judged.get(c) or _judged(judged, c, f"line {line_no}, {name}/{columns[k]}")
                for k, c in enumerate(raw)
            ]
        if m := _GPU.fullmatch(name):
            gpu = int(m[1])
            # Drivers print an empty cell before GPU NUMA ID: the values are the non-empty cells, in order.
            values = dict(
                zip(affinity, [c.strip() for c in cells[1 + len(columns) :] if c.strip()], strict=False)
            )
            out.cpu_affinity[gpu] = _blank(values.get("CPU Affinity", ""))
            out.numa_affinity[gpu] = _blank(values.get("NUMA Affinity", ""))
            out.gpu_numa_id[gpu] = _blank(values.get("GPU NUMA ID", ""))
    for line in lines[end:]:
        m = _LEGEND.fullmatch(line)
        if m:
            out.nics[m[1]] = m[2]
    for name, links in rows.items():
        if _GPU.fullmatch(name):
            _gpu_row(out, name, links, columns)
    if not out.gpus:
        raise TopoParseError("the matrix has no GPU rows")
    out.gpus.sort()
    return out
