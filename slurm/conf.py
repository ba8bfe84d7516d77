"""slurm.conf as data: parse a site's file and render the settings fill work depends on.

The rendered fragment comes from the shipped, commented template ``fill-partitions.conf.tpl``,
so the lines the tests run under are the lines a site adopts. The parser understands just what
the validator needs: global ``Key=Value`` lines and ``NodeName=`` / ``PartitionName=`` lines.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from string import Template

from ttsfleet.contracts.exits import PREEMPTED_REQUEUE
from ttsfleet.contracts.fill import GRACE_PERIOD_S

TEMPLATE_NAME = "fill-partitions.conf.tpl"
DEFAULT_TRAIN_PARTITION = "train"
DEFAULT_FILL_PARTITION = "fill"


class ConfSyntaxError(ValueError):
    """A slurm.conf line that is not ``Key=Value`` pairs."""


@dataclass
class Record:
    """A ``NodeName=``/``PartitionName=`` line: its name plus its other options (keys lowercased)."""

    name: str
    options: dict[str, str]
    line: int

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.options.get(key.lower(), default)


@dataclass
class SlurmConf:
    """The parts of a slurm.conf the validator reads. Global keys are lowercased."""

    path: str
    globals: dict[str, tuple[str, int]] = field(default_factory=dict)  # key -> (value, line)
    nodes: list[Record] = field(default_factory=list)
    partitions: list[Record] = field(default_factory=list)
    includes: list[tuple[str, int]] = field(default_factory=list)
    #: global keys set more than once: key -> every (value, line), in file order (the last wins)
    repeats: dict[str, list[tuple[str, int]]] = field(default_factory=dict)
    #: lowercased key -> the spelling the file used
    key_names: dict[str, str] = field(default_factory=dict)
    #: NodeName/PartitionName records defined more than once: (kind, name) -> lines
    repeated_records: dict[tuple[str, str], list[int]] = field(default_factory=dict)

    def get(self, key: str) -> str | None:
        hit = self.globals.get(key.lower())
        return hit[0] if hit else None

    def partition(self, name: str) -> Record | None:
        return next((p for p in self.partitions if p.name == name), None)


_PAIR = re.compile(r'(\w+)=("[^"]*"|\S+)')


def _pairs(text: str, lineno: int) -> list[tuple[str, str]]:
    pairs = [(k, v.strip('"')) for k, v in _PAIR.findall(text)]
    leftover = _PAIR.sub("", text).strip()
    if not pairs or leftover:
        raise ConfSyntaxError(f"line {lineno}: expected Key=Value, got {text.strip()!r}")
    return pairs


def parse_conf(text: str, path: str = "slurm.conf") -> SlurmConf:
    """Parse slurm.conf text. Raises :class:`ConfSyntaxError` with the line number on bad lines."""
    conf = SlurmConf(path=path)
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.lower().startswith("include "):
            conf.includes.append((line.split(None, 1)[1], lineno))
            continue
        pairs = _pairs(line, lineno)
        head_key, head_val = pairs[0]
        if head_key.lower() in ("nodename", "partitionname"):
            rec = Record(head_val, {k.lower(): v for k, v in pairs[1:]}, lineno)
            if head_val.upper() == "DEFAULT":
                continue
            kind = head_key.lower()
            records = conf.nodes if kind == "nodename" else conf.partitions
            earlier = [r.line for r in records if r.name == head_val]
            if earlier:
                conf.repeated_records.setdefault((head_key, head_val), earlier).append(lineno)
            records.append(rec)
            continue
        if len(pairs) != 1:
            raise ConfSyntaxError(f"line {lineno}: one Key=Value per line expected, got {line!r}")
        key = head_key.lower()
        if key in conf.globals:
            conf.repeats.setdefault(key, [conf.globals[key]]).append((head_val, lineno))
        conf.globals[key] = (head_val, lineno)  # Slurm reads the file top down: the last one wins
        conf.key_names[key] = head_key
    return conf


def read_conf(path: str | Path) -> SlurmConf:
    """Read and parse a slurm.conf file (``OSError`` / :class:`ConfSyntaxError` on failure)."""
    p = Path(path)
    return parse_conf(p.read_text(), str(p))


def expand_hostlist(expr: str) -> list[str]:
    """Expand a Slurm hostlist such as ``n[1-3,5],gpu-a`` into names (no nested brackets)."""
    names: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\][^,\[]*)*", expr):
        m = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", part)
        if not m:
            names.append(part)
            continue
        prefix, ranges, suffix = m.groups()
        for r in ranges.split(","):
            lo, _, hi = r.partition("-")
            width = len(lo)
            for i in range(int(lo), int(hi or lo) + 1):
                names.extend(expand_hostlist(f"{prefix}{i:0{width}d}{suffix}"))
    return names


def comma_set(value: str | None) -> set[str]:
    return {v.strip().lower() for v in (value or "").split(",") if v.strip()}


def render_fill_conf(*, nodes: str, grace_period_s: int = GRACE_PERIOD_S, cred_expire_s: int = 30,
                     munge_socket: str | None = None,
                     train_partition: str = DEFAULT_TRAIN_PARTITION,
                     fill_partition: str = DEFAULT_FILL_PARTITION,
                     slurmctld_parameters: tuple[str, ...] = ()) -> str:
    """The commented fill/train configuration fragment for ``nodes`` (a hostlist)."""
    auth = ([f"socket={munge_socket}"] if munge_socket else []) + [f"cred_expire={cred_expire_s}"]
    params = ["preempt_send_user_signal", *slurmctld_parameters]
    tpl = Template(resources.files("ttsfleet.slurm").joinpath(TEMPLATE_NAME).read_text())
    text = tpl.substitute(nodes=nodes, grace_period_s=int(grace_period_s), auth_info=",".join(auth),
                          slurmctld_parameters=",".join(params), train_partition=train_partition,
                          fill_partition=fill_partition, requeue_exit=PREEMPTED_REQUEUE)
    return text
