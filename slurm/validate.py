"""Check a site's slurm.conf for the settings preemptible fill work depends on.

Each finding names the line, what is wrong and what fill work loses because of it. Errors are
settings under which fill work is lost or training waits (a preempted fill job recorded
COMPLETED, no warning signal, fill not preemptible); warnings are settings that only cost time
(the 120 s default requeue delay). The three Slurm traps measured in ``/work/shared/slurm`` are
all covered: RequeueExit, ``preempt_send_user_signal`` and ``cred_expire``; so is the trap of
adopting the rendered fragment by appending it: a key set twice silently takes the last value
(:func:`repeated_settings`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ttsfleet.slurm.backend import parse_gres
from ttsfleet.slurm.conf import (
    DEFAULT_FILL_PARTITION,
    DEFAULT_TRAIN_PARTITION,
    ConfSyntaxError,
    SlurmConf,
    comma_set,
    expand_hostlist,
    read_conf,
)

from ttsfleet.catalog import GpuCatalog
from ttsfleet.contracts.exits import PREEMPTED_REQUEUE

Severity = Literal["error", "warning"]
SLURM_DEFAULT_CRED_EXPIRE_S = 120
MAX_SENSIBLE_CRED_EXPIRE_S = 60


@dataclass(frozen=True)
class Finding:
    severity: Severity
    line: int | None
    message: str

    def format(self, path: str) -> str:
        where = f"{path}:{self.line}" if self.line else path
        return f"{where}: {self.severity}: {self.message}"


def _line(conf: SlurmConf, key: str) -> int | None:
    hit = conf.globals.get(key.lower())
    return hit[1] if hit else None


def _int(value: str | None, default: int) -> int:
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        return default


def _exit_codes(value: str | None) -> set[int]:
    """``RequeueExit=99,100-102`` → {99, 100, 101, 102}."""
    codes: set[int] = set()
    for part in (value or "").split(","):
        lo, _, hi = part.strip().partition("-")
        if lo.isdigit():
            codes.update(range(int(lo), int(hi if hi.isdigit() else lo) + 1))
    return codes


def _node_set(conf: SlurmConf, expr: str | None) -> set[str]:
    if not expr:
        return set()
    if expr.upper() == "ALL":
        return {n for rec in conf.nodes for n in expand_hostlist(rec.name)}
    return set(expand_hostlist(expr))


def check_conf(conf: SlurmConf, catalog: GpuCatalog, *, fill_partition: str = DEFAULT_FILL_PARTITION,
               train_partition: str = DEFAULT_TRAIN_PARTITION) -> list[Finding]:
    """All findings for ``conf`` (empty when fill work is safe under it); GPU types must be
    classes of the run's ``catalog``."""
    out: list[Finding] = []

    def err(line: int | None, msg: str) -> None:
        out.append(Finding("error", line, msg))

    def warn(line: int | None, msg: str) -> None:
        out.append(Finding("warning", line, msg))

    for path, line in conf.includes:
        warn(line, f"Include {path} is not followed: check the included file separately")
    out.extend(repeated_settings(conf))

    # --- preemption by partition priority, requeueing the preempted job -----------------------
    ptype = (conf.get("PreemptType") or "preempt/none").lower()
    if ptype != "preempt/partition_prio":
        err(_line(conf, "PreemptType"), f"PreemptType={ptype}: must be preempt/partition_prio so "
            f"jobs in the '{train_partition}' partition preempt '{fill_partition}' jobs")
    gmode = comma_set(conf.get("PreemptMode") or "OFF")
    if "requeue" not in gmode:
        warn(_line(conf, "PreemptMode"), f"PreemptMode={conf.get('PreemptMode') or 'OFF'}: set REQUEUE "
             "globally (the fill partition must override it with PreemptMode=REQUEUE otherwise)")
    if conf.get("JobRequeue") is not None and conf.get("JobRequeue") != "1":
        warn(_line(conf, "JobRequeue"), "JobRequeue=0: batch jobs are not requeued unless submitted "
             "with --requeue (the ttsfleet templates pass it; other fill jobs would be lost)")

    # --- trap 1: a checkpointed job exiting 0 is COMPLETED, never requeued ---------------------
    requeue_codes = _exit_codes(conf.get("RequeueExit"))
    if PREEMPTED_REQUEUE not in requeue_codes:
        err(_line(conf, "RequeueExit"), f"RequeueExit must include {PREEMPTED_REQUEUE}: a fill job "
            "that checkpoints on the warning signal exits 99; without it Slurm records the job "
            "FAILED/COMPLETED instead of requeueing it and the rest of its shard is lost")
    if PREEMPTED_REQUEUE in _exit_codes(conf.get("RequeueExitHold")):
        err(_line(conf, "RequeueExitHold"), f"RequeueExitHold includes {PREEMPTED_REQUEUE}: preempted "
            "fill jobs would be requeued held and never resume on their own")

    # --- trap 2: --signal=B:USR1@T only fires at preemption with preempt_send_user_signal -------
    if "preempt_send_user_signal" not in comma_set(conf.get("SlurmctldParameters")):
        err(_line(conf, "SlurmctldParameters"), "SlurmctldParameters lacks preempt_send_user_signal: "
            "the fill job's --signal=B:USR1 is not sent at preemption, so it gets no warning and "
            "cannot checkpoint before GraceTime ends")

    # --- trap 3: a requeued job waits cred_expire seconds before it may start again -------------
    auth = dict(kv.split("=", 1) for kv in (conf.get("AuthInfo") or "").split(",") if "=" in kv)
    cred = _int(auth.get("cred_expire"), SLURM_DEFAULT_CRED_EXPIRE_S)
    if cred > MAX_SENSIBLE_CRED_EXPIRE_S:
        origin = "set" if "cred_expire" in auth else "Slurm default"
        warn(_line(conf, "AuthInfo"), f"cred_expire={cred} s ({origin}): a requeued fill job "
             f"waits this long before it may restart; set "
             f"AuthInfo=...,cred_expire=30 or less")

    # --- GRES: the GPU class is the GRES type ----------------------------------------------------
    if "gpu" not in comma_set(conf.get("GresTypes")):
        err(_line(conf, "GresTypes"), "GresTypes must include gpu")
    known = set(catalog.names())

    # --- partitions ------------------------------------------------------------------------------
    fill = conf.partition(fill_partition)
    train = conf.partition(train_partition)
    if fill is None:
        err(None, f"no PartitionName={fill_partition}: fill jobs need their own lowest-tier partition")
    if train is None:
        err(None, f"no PartitionName={train_partition}: training needs a partition above '{fill_partition}'")
    if fill is None:
        return out
    fill_tier = _int(fill.get("PriorityTier"), 1)
    fill_mode = comma_set(fill.get("PreemptMode") or conf.get("PreemptMode") or "OFF")
    if "requeue" not in fill_mode:
        err(fill.line, f"partition {fill_partition}: PreemptMode must be REQUEUE (is "
            f"{fill.get('PreemptMode') or conf.get('PreemptMode') or 'OFF'}): fill jobs must be "
            "requeued, not cancelled or suspended holding GPU memory")
    grace = _int(fill.get("GraceTime"), 0)
    if grace <= 0:
        err(fill.line, f"partition {fill_partition}: GraceTime must be > 0: without it a preempted "
            "fill job is killed at once with no time to checkpoint")
    fill_nodes = _node_set(conf, fill.get("Nodes"))
    if not fill_nodes:
        err(fill.line, f"partition {fill_partition}: no Nodes=")
    for part in conf.partitions:
        if part.name == fill_partition or not (_node_set(conf, part.get("Nodes")) & fill_nodes):
            continue
        tier = _int(part.get("PriorityTier"), 1)
        if tier <= fill_tier:
            err(part.line, f"partition {part.name}: PriorityTier={tier} is not above "
                f"{fill_partition}'s {fill_tier}: its jobs cannot preempt fill work on shared nodes")
    if train is not None:
        if not (_node_set(conf, train.get("Nodes")) & fill_nodes):
            warn(train.line, f"partitions {train_partition} and {fill_partition} share no nodes: "
                 "fill never yields to training")
        if "requeue" in comma_set(train.get("PreemptMode") or ""):
            warn(train.line, f"partition {train_partition}: PreemptMode=REQUEUE makes training "
                 "preemptible too; use OFF")

    # --- fill nodes carry typed GPUs of known classes ---------------------------------------------
    for rec in conf.nodes:
        names = set(expand_hostlist(rec.name))
        if not names & fill_nodes:
            continue
        gres = parse_gres(rec.get("Gres"))
        if not gres:
            warn(rec.line, f"NodeName={rec.name}: no Gres=gpu:<class>:N in the fill partition")
            continue
        for cls in gres:
            if cls == "gpu":
                err(rec.line, f"NodeName={rec.name}: untyped GPUs (Gres=gpu:N): give the GPU class "
                    f"as the GRES type, e.g. Gres=gpu:h200:{gres[cls]}")
            elif cls not in known:
                warn(rec.line, f"NodeName={rec.name}: GRES type {cls!r} is not a ttsfleet GPU class "
                     f"({', '.join(sorted(known))})")
    return out


#: Settings that decide who may talk to whom: a later line replacing an earlier one breaks every
#: Slurm command or daemon connection (e.g. the munge socket lost from AuthInfo).
AUTH_KEYS = ("authtype", "authinfo", "authalttypes", "authaltparameters", "credtype",
             "accountingstoragepass")
#: Comma lists sites extend: a second line replaces the first instead of adding to it.
LIST_KEYS = ("slurmctldparameters", "slurmdparameters", "schedulerparameters", "grestypes",
             "preemptmode", "priorityflags", "taskpluginparam", "launchparameters")


def _items(value: str) -> dict[str, str]:
    """``socket=/s,cred_expire=30`` → {socket: /s, cred_expire: 30}; plain list items map to ''."""
    out = {}
    for part in value.split(","):
        name, _, val = part.strip().partition("=")
        if name:
            out[name.lower()] = val
    return out


def repeated_settings(conf: SlurmConf) -> list[Finding]:
    """Keys set twice (the last line silently wins) and records defined twice.

    The usual way in: appending ``render-conf`` output to a slurm.conf that already sets
    ``AuthInfo=socket=...`` or ``SlurmctldParameters=...``: the appended line replaces the site's,
    dropping the munge socket (every Slurm command then fails) or the site's own parameters.
    """
    out: list[Finding] = []
    for key, hits in sorted(conf.repeats.items()):
        name = conf.key_names.get(key, key)
        where = ", ".join(str(line) for _, line in hits)
        (first, first_line), (last, last_line) = hits[0], hits[-1]
        if len({v for v, _ in hits}) == 1:
            out.append(Finding("warning", last_line, f"{name} is set {len(hits)} times (lines {where}) "
                               "with the same value: keep one line"))
            continue
        earlier = {k: v for value, _ in hits[:-1] for k, v in _items(value).items()}
        final = _items(last)
        lost = [f"{k}={v}" if v else k for k, v in earlier.items() if k not in final]
        msg = (f"{name} is set on lines {where}; Slurm uses only the last ({name}={last}), so line "
               f"{first_line}'s {name}={first} is ignored")
        if lost:
            msg += f" and {', '.join(lost)} is lost"
        if key in AUTH_KEYS and "socket" in earlier and "socket" not in final:
            msg += (" (Slurm then talks to munge's default socket, which this site's munged may not "
                    "use: every Slurm command fails)")
        severity: Severity = "error" if key in AUTH_KEYS or (key in LIST_KEYS and lost) else "warning"
        fix = f"merge them into one {name}= line" if severity == "error" else "keep one line"
        out.append(Finding(severity, last_line, f"{msg}; {fix}"))
    for (kind, name), lines in sorted(conf.repeated_records.items()):
        out.append(Finding("error", lines[-1], f"{kind}={name} is defined {len(lines)} times (lines "
                           f"{', '.join(map(str, lines))}): Slurm refuses or merges it unpredictably; "
                           "keep one definition"))
    return out


def validate_file(path: str, catalog: GpuCatalog, **kw: str) -> list[Finding]:
    """Findings for the slurm.conf at ``path``; an unreadable or malformed file is one error."""
    try:
        conf = read_conf(path)
    except OSError as exc:
        return [Finding("error", None, f"cannot read: {exc.strerror or exc}")]
    except ConfSyntaxError as exc:
        msg = str(exc)
        line = int(msg.split(":")[0].removeprefix("line ")) if msg.startswith("line ") else None
        return [Finding("error", line, msg.split(": ", 1)[-1])]
    return check_conf(conf, catalog, **kw)
