"""A real one-host Slurm cluster under a directory: munged, slurmctld, N slurmd, optional slurmrestd.

For tests and for a developer's laptop (root, Slurm 22.05+, munge; no systemd). Everything lives
under one directory (configs, munge key and socket, state, logs, pid files, fake GPU device
nodes) and every port is picked free, so several clusters coexist on one host. The fill and
train partitions come from :func:`ttsfleet.slurm.conf.render_fill_conf`, the same fragment a site
adopts. Daemons are stopped by their pid files only, and :meth:`LocalCluster.stop` is registered
with :mod:`atexit` so a crashed test run leaves nothing behind.

Traps handled here (measured on Debian 12 VMs): munged needs its socket dir mode 755; GRES
``File=`` must be character devices for slurmd to export ``CUDA_VISIBLE_DEVICES`` (``mknod c
195 N``); cgroup v2 is unusable on these hosts, so ``proctrack/linuxproc`` + ``task/none``;
slurmrestd refuses root unless ``SLURMRESTD_SECURITY=disable_user_check``.

Another Slurm installation (e.g. a Slurm 25.11 built under ``/opt/slurm-25.11`` for the pyslurm
backend) is used instead of the one on ``PATH`` when ``TTSFLEET_SLURM_PREFIX`` names its prefix:
its ``bin``/``sbin`` come first on the cluster's ``PATH`` and only its programs count (munge
still comes from the host). Unset, nothing changes.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from ttsfleet.devtools.ports import free_port
from ttsfleet.slurm.conf import render_fill_conf

#: slurmrestd API plugins to load: every version Debian 12's 22.05 has, so clients negotiate.
RESTD_PLUGINS = "openapi/v0.0.38,openapi/v0.0.37,openapi/v0.0.36"
DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd", "sinfo", "scontrol", "sbatch", "squeue")
#: Names the prefix of another Slurm installation to run instead of the one on ``PATH``.
SLURM_PREFIX_ENV = "TTSFLEET_SLURM_PREFIX"
MUNGE_PROGRAMS = ("munged", "mungekey")


class LocalClusterError(RuntimeError):
    """The local cluster could not be started (the message carries the log tail)."""


@dataclass(frozen=True)
class LocalClusterSpec:
    """Shape and timing of a local cluster. Short times keep preemption tests fast."""

    nodes: int = 1
    cpus_per_node: int = 8
    mem_mb_per_node: int = 16000
    gpus_per_node: int = 4
    gpu_class: str = field(default_factory=lambda: _first_catalog_class())
    grace_period_s: int = 5
    kill_wait_s: int = 2
    cred_expire_s: int = 5
    #: How often the main scheduler tests every pending job (Slurm's default is 60 s). A requeued
    #: job becomes eligible at its BeginTime (requeue + cred_expire + 1 s), but nothing in Slurm
    #: reacts to that moment: the backfill scheduler skips its cycles while no job, node,
    #: partition or reservation changed (``_more_work``), and the main scheduler runs on events
    #: or every ``sched_interval``. On a quiet cluster a requeued job so waits up to this long
    #: after its BeginTime.
    sched_interval_s: int = 5
    restd: bool = False
    dbd: bool = False  # MariaDB + slurmdbd: accounting, so sacct works
    cluster_name: str = "ttsfleet-local"


def _first_catalog_class() -> str:
    """The fake GPUs' class when none is given: the built-in catalog's first class."""
    from ttsfleet.catalog import GpuCatalog

    return GpuCatalog.default().names()[0]



DBD_PROGRAMS = ("slurmdbd", "mariadbd", "mariadb-install-db", "mariadb-admin", "sacctmgr", "sacct")


def slurm_prefix() -> Path | None:
    """The Slurm installation named by ``TTSFLEET_SLURM_PREFIX``, or None (use ``PATH``)."""
    value = os.environ.get(SLURM_PREFIX_ENV, "").strip()
    return Path(value) if value else None


def slurm_path(base: str | None = None) -> str:
    """``PATH`` with the prefix's ``bin`` and ``sbin`` first (``base`` unchanged without a prefix)."""
    base = os.environ.get("PATH", "") if base is None else base
    prefix = slurm_prefix()
    if prefix is None:
        return base
    return os.pathsep.join([str(prefix / "bin"), str(prefix / "sbin"), base])


def _has_program(name: str) -> bool:
    prefix = slurm_prefix()
    if prefix is not None and name not in MUNGE_PROGRAMS and not name.startswith("mariadb"):
        if name == "slurmdbd":  # and the MySQL storage plugin, which a minimal build lacks
            return (prefix / "sbin/slurmdbd").exists() and any(
                prefix.glob("lib*/slurm/accounting_storage_mysql.so"))
        return any((prefix / d / name).exists() for d in ("bin", "sbin"))
    return shutil.which(name) is not None or Path("/usr/sbin", name).exists()


def slurm_release() -> tuple[int, int] | None:
    """(major, minor) of the Slurm whose ``slurmctld`` comes first on :func:`slurm_path`, or None.

    ``slurmctld -V`` answers without a slurm.conf (the client commands' ``--version`` does not).
    """
    path = os.pathsep.join([slurm_path(), "/usr/sbin"])
    try:
        out = subprocess.run(["slurmctld", "-V"], env={**os.environ, "PATH": path},
                             capture_output=True, text=True, timeout=30).stdout.split()
        major, minor = out[-1].split(".")[:2]
        return int(major), int(minor)
    except (OSError, subprocess.SubprocessError, IndexError, ValueError):
        return None


def restd_supported() -> bool:
    """Whether this host's slurmrestd runs here as root (with ``disable_user_check``).

    Debian's 22.05 does. A production build of 25.11 (checked: 25.11.7) aborts on
    ``SLURMRESTD_SECURITY=disable_user_check`` and refuses root and SlurmUser, and its openapi
    plugins are no longer per version; the release that changed it was not checked, so anything
    from 23.11 on counts as unsupported (an unknown release is tried, as before).
    """
    release = slurm_release()
    return release is None or release < (23, 11)


def missing_binaries(restd: bool = False, dbd: bool = False) -> list[str]:
    """Slurm/munge programs this host (or the ``TTSFLEET_SLURM_PREFIX`` installation) lacks."""
    names = list(DAEMONS) + (["slurmrestd"] if restd else []) + (list(DBD_PROGRAMS) if dbd else [])
    return [n for n in names if not _has_program(n)]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    try:  # a zombie is not alive (PID 1 of some sandboxes does not reap)
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class LocalCluster:
    """Start/stop a local Slurm cluster under ``root``. Use as a context manager or call start/stop."""

    def __init__(self, root: str | Path, spec: LocalClusterSpec | None = None) -> None:
        self.root = Path(root).resolve()
        self.spec = spec or LocalClusterSpec()
        self.etc, self.run, self.log = self.root / "etc", self.root / "run", self.root / "log"
        self.state, self.munge_dir, self.dev = self.root / "state", self.root / "munge", self.root / "dev"
        self.node_names = [f"n{i}" for i in range(1, self.spec.nodes + 1)]
        self.ctld_port = 0
        self.dbd_port = 0
        self.mysql_port = 0
        self._started = False

    # ------------------------------------------------------------------ paths and environment
    @property
    def conf_path(self) -> Path:
        return self.etc / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        return self.munge_dir / "munge.sock"

    @property
    def restd_socket(self) -> Path:
        return self.run / "slurmrestd.sock"

    @property
    def jobcomp_path(self) -> Path:
        return self.log / "jobcomp.txt"

    @property
    def nodelist(self) -> str:
        return ",".join(self.node_names)

    @property
    def total_gpus(self) -> int:
        return self.spec.gpus_per_node * self.spec.nodes

    def env(self) -> dict[str, str]:
        """``os.environ`` plus ``SLURM_CONF`` pointing at this cluster (and the prefix's PATH)."""
        return {**os.environ, "SLURM_CONF": str(self.conf_path), "PATH": slurm_path()}

    # ------------------------------------------------------------------ configuration
    def write_config(self) -> None:
        for d in (self.etc, self.run, self.log, self.state / "ctld", self.munge_dir, self.dev):
            d.mkdir(parents=True, exist_ok=True)
        for d in (self.root, self.run, self.munge_dir):
            d.chmod(0o755)  # munged insists its socket directory is world-executable
        s = self.spec
        self.ctld_port = free_port()
        if s.dbd:
            self.dbd_port, self.mysql_port = free_port(), free_port()
        slurmd_ports = [free_port() for _ in self.node_names]
        gres = f" Gres=gpu:{s.gpu_class}:{s.gpus_per_node}" if s.gpus_per_node else ""
        base = f"""# ttsfleet local cluster under {self.root} (ttsfleet.devtools.localcluster)
ClusterName={s.cluster_name}
SlurmctldHost=localhost
SlurmctldPort={self.ctld_port}
SlurmdPort={slurmd_ports[0]}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation={self.state / 'ctld'}
SlurmdSpoolDir={self.state / 'slurmd-%n'}
SlurmctldPidFile={self.run / 'slurmctld.pid'}
SlurmdPidFile={self.run / 'slurmd-%n.pid'}
SlurmctldLogFile={self.log / 'slurmctld.log'}
SlurmdLogFile={self.log / 'slurmd-%n.log'}
SlurmctldDebug=info
SlurmdDebug=info
# no cgroups: works in containers and VMs without a writable cgroup hierarchy
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
MailProg=/bin/true
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1000
SchedulerType=sched/backfill
# the main scheduler's full pass is what starts a requeued job once its BeginTime has passed
# (the backfill scheduler only runs after a change): every {s.sched_interval_s} s, not Slurm's 60
SchedulerParameters=bf_interval=2,sched_interval={s.sched_interval_s}
PriorityType=priority/basic
# advertise CPUs, memory and GPUs beyond the real hardware
SlurmdParameters=config_overrides
ReturnToService=2
KillWait={s.kill_wait_s}
MinJobAge=300
InactiveLimit=0
MessageTimeout=10
{self._accounting()}
# without slurmdbd the job completion log is where finished jobs (and their restarts) show
JobCompType=jobcomp/filetxt
JobCompLoc={self.jobcomp_path}
"""
        nodes = "".join(
            f"NodeName={n} NodeHostname=localhost NodeAddr=127.0.0.1 Port={port} "
            f"CPUs={s.cpus_per_node} RealMemory={s.mem_mb_per_node}{gres} State=UNKNOWN\n"
            for n, port in zip(self.node_names, slurmd_ports, strict=True))
        fill = render_fill_conf(nodes=self.nodelist, grace_period_s=s.grace_period_s,
                                cred_expire_s=s.cred_expire_s, munge_socket=str(self.munge_socket))
        self.conf_path.write_text(base + nodes + fill)
        gres_lines = ["AutoDetect=off"]
        for n in self.node_names:
            if not s.gpus_per_node:
                continue
            (self.dev / n).mkdir(exist_ok=True)
            for g in range(s.gpus_per_node):
                path = self.dev / n / f"nvidia{g}"
                if not path.exists():  # a char device like nvidia's (major 195); never opened
                    try:
                        os.mknod(path, 0o600 | 0o020000, os.makedev(195, g))
                    except OSError:
                        path.touch()
            gres_lines.append(f"NodeName={n} Name=gpu Type={s.gpu_class} "
                              f"File={self.dev / n}/nvidia[0-{s.gpus_per_node - 1}]")
        (self.etc / "gres.conf").write_text("\n".join(gres_lines) + "\n")
        (self.etc / "cgroup.conf").write_text("CgroupPlugin=autodetect\n")
        (self.root / "env.sh").write_text(f"export SLURM_CONF={self.conf_path}\n")

    def _accounting(self) -> str:
        if not self.spec.dbd:
            return "AccountingStorageType=accounting_storage/none"
        return f"""AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort={self.dbd_port}
# for slurmdbd connections the munge socket comes from AccountingStoragePass, not AuthInfo
AccountingStoragePass={self.munge_socket}
AccountingStorageTRES=gres/gpu,gres/gpu:{self.spec.gpu_class}"""

    def _write_dbd_conf(self) -> None:
        path = self.etc / "slurmdbd.conf"
        path.write_text(f"""AuthType=auth/munge
AuthInfo=socket={self.munge_socket}
DbdHost=localhost
DbdPort={self.dbd_port}
SlurmUser=root
PidFile={self.run / 'slurmdbd.pid'}
LogFile={self.log / 'slurmdbd.log'}
DebugLevel=info
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={self.mysql_port}
StorageUser=root
StorageLoc=slurm_acct_db
""")
        path.chmod(0o600)  # slurmdbd refuses a world-readable slurmdbd.conf

    def _start_dbd(self, timeout: float) -> None:
        """MariaDB (own datadir and socket) and slurmdbd, then register the cluster."""
        datadir, sock = self.state / "mysql", self.run / "mysqld.sock"
        if not (datadir / "mysql").is_dir():
            datadir.mkdir(parents=True, exist_ok=True)
            r = self._run("mariadb-install-db", "--no-defaults", f"--datadir={datadir}", "--user=root",
                          "--auth-root-authentication-method=normal", "--skip-test-db")
            if r.returncode:
                raise LocalClusterError(f"mariadb-install-db failed: {r.stderr.strip()[-500:]}")
        with open(self.log / "mysqld.out", "ab") as logf:
            proc = subprocess.Popen(
                ["mariadbd", "--no-defaults", f"--datadir={datadir}", f"--socket={sock}",
                 f"--port={self.mysql_port}", "--bind-address=127.0.0.1",
                 f"--pid-file={self.run / 'mysqld.pid'}", "--user=root",
                 f"--log-error={self.log / 'mysqld.err'}", "--skip-name-resolve",
                 "--innodb-buffer-pool-size=16M", "--innodb-log-file-size=8M",
                 "--performance-schema=OFF"],
                stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, start_new_session=True)
        self._mysqld_proc = proc
        self._wait("mariadb", lambda: self._run("mariadb-admin", "--no-defaults", f"--socket={sock}",
                                                "-uroot", "ping").returncode == 0, timeout, "mysqld.err")
        self._write_dbd_conf()
        r = self._run("slurmdbd")
        if r.returncode:
            raise LocalClusterError(f"slurmdbd failed: {r.stderr.strip()}\n{self._tail('slurmdbd.log')}")
        self._wait("slurmdbd", lambda: self._run("sacctmgr", "-n", "show", "cluster").returncode == 0,
                   timeout, "slurmdbd.log")
        self._run("sacctmgr", "-i", "-Q", "add", "cluster", self.spec.cluster_name)

    # ------------------------------------------------------------------ lifecycle
    def _run(self, *args: str, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(list(args), env=self.env(), capture_output=True, text=True, **kw)

    def _tail(self, name: str, n: int = 15) -> str:
        p = self.log / name
        return "\n".join(p.read_text(errors="replace").splitlines()[-n:]) if p.exists() else ""

    def diagnosis(self, log_lines: int = 40) -> str:
        """What a failed wait on this cluster needs to be understood without rerunning it.

        Every job with Slurm's pending reason and times, node states with their reasons (a drained
        node starts nothing), and the controller's last log lines. Best effort: a command that
        fails contributes its error, never an exception."""
        parts = []
        for title, args in (
                ("squeue", ("squeue", "-h", "-a", "-t", "all", "-o", "%i|%P|%j|%T|%r|%S|%V|%b")),
                ("sinfo -R", ("sinfo", "-h", "-R", "-o", "%N|%T|%E|%H")),
                ("sinfo -N", ("sinfo", "-h", "-N", "-o", "%N|%T|%G|%C"))):
            try:
                r = self._run(*args, timeout=15)
                parts.append(f"{title}:\n{r.stdout.strip() or r.stderr.strip()}")
            except (OSError, subprocess.SubprocessError) as exc:
                parts.append(f"{title}: {exc}")
        parts.append(f"slurmctld.log (last {log_lines} lines):\n{self._tail('slurmctld.log', log_lines)}")
        return "\n".join(parts)

    def _wait(self, what: str, cond, timeout: float = 30.0, log: str = "slurmctld.log") -> None:
        end = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > end:
                raise LocalClusterError(f"timeout waiting for {what}; {log}:\n{self._tail(log)}")
            time.sleep(0.1)

    def _pidfile_alive(self, pidfile: Path) -> bool:
        try:
            return _pid_alive(int(pidfile.read_text().strip()))
        except (OSError, ValueError):
            return False

    def start(self, timeout: float = 60.0) -> LocalCluster:
        missing = missing_binaries(self.spec.restd, self.spec.dbd)
        if missing:
            raise LocalClusterError(f"missing programs: {', '.join(missing)}")
        if self.spec.restd and not restd_supported():
            raise LocalClusterError("this Slurm's slurmrestd does not run as root (Slurm 23.11+): "
                                    "start the cluster without slurmrestd")
        self.write_config()
        atexit.register(self.stop)
        self._started = True
        key = self.munge_dir / "munge.key"
        if not key.exists():
            self._run("mungekey", "-c", "-k", str(key), check=True)
        key.chmod(0o600)
        for stale in (self.munge_socket, Path(f"{self.munge_socket}.lock")):
            stale.unlink(missing_ok=True)
        self._run("munged", "--force", "-S", str(self.munge_socket), f"--key-file={key}",
                  f"--log-file={self.log / 'munged.log'}", f"--pid-file={self.munge_dir / 'munged.pid'}",
                  f"--seed-file={self.munge_dir / 'munged.seed'}", check=True)
        self._wait("munged", self.munge_socket.exists, 15, "munged.log")
        if self.spec.dbd:
            self._start_dbd(timeout)
        r = self._run("slurmctld", "-i")
        if r.returncode:
            raise LocalClusterError(f"slurmctld failed: {r.stderr.strip()}\n{self._tail('slurmctld.log')}")
        self._wait("slurmctld", lambda: self._pidfile_alive(self.run / "slurmctld.pid"), 15)
        for n in self.node_names:
            (self.state / f"slurmd-{n}").mkdir(parents=True, exist_ok=True)
            r = self._run("slurmd", "-N", n)
            if r.returncode:
                raise LocalClusterError(
                    f"slurmd {n} failed: {r.stderr.strip()}\n{self._tail(f'slurmd-{n}.log')}")
        if self.spec.restd:
            self._start_restd()
        self._wait("nodes idle", self._nodes_ready, timeout)
        if self.spec.restd:
            self._wait("slurmrestd socket", self.restd_socket.exists, timeout, "slurmrestd.log")
        return self

    def _start_restd(self) -> None:
        self.restd_socket.unlink(missing_ok=True)
        env = {**self.env(), "SLURMRESTD_SECURITY": "disable_user_check"}
        with open(self.log / "slurmrestd.log", "ab") as logf:
            proc = subprocess.Popen(
                ["slurmrestd", "-a", "rest_auth/local", "-s", RESTD_PLUGINS,
                 f"unix:{self.restd_socket}"],
                env=env, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, start_new_session=True)
        (self.run / "slurmrestd.pid").write_text(f"{proc.pid}\n")
        self._restd_proc = proc

    def _nodes_ready(self) -> bool:
        r = self._run("sinfo", "-h", "-N", "-o", "%N %t")
        if r.returncode:
            return False
        states = {}
        for line in r.stdout.split("\n"):
            if line.strip():
                name, st = line.split()
                states[name] = st
        return set(states) == set(self.node_names) and all(
            st in ("idle", "mix", "alloc") for st in states.values())

    def cancel_all_jobs(self, timeout: float = 30.0) -> None:
        """Cancel every job and wait until none is running (job processes would outlive slurmd)."""
        if not self._pidfile_alive(self.run / "slurmctld.pid"):
            return
        self._run("scancel", "--full", "--user=root", timeout=15)
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            r = self._run("squeue", "-h", "-t", "R,CG,S,CF,PD,RQ,RS,SE", "-o", "%i", timeout=15)
            if r.returncode or not r.stdout.strip():
                return
            time.sleep(0.2)

    def stop(self) -> None:
        """Stop every daemon this cluster started, by pid file. Idempotent."""
        if not self._started:
            return
        self._started = False
        with contextlib.suppress(Exception):
            self.cancel_all_jobs()
        pidfiles = [self.run / "slurmrestd.pid",
                    *sorted(self.run.glob("slurmd-*.pid")),
                    self.run / "slurmctld.pid",
                    self.run / "slurmdbd.pid",
                    self.run / "mysqld.pid",
                    self.munge_dir / "munged.pid"]
        for pf in pidfiles:
            self._stop_pidfile(pf)
        for name in ("_restd_proc", "_mysqld_proc"):
            proc = getattr(self, name, None)
            if proc is not None:
                with contextlib.suppress(Exception):
                    proc.wait(timeout=1)
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)

    @staticmethod
    def _stop_pidfile(pidfile: Path, timeout: float = 10.0) -> None:
        try:
            pid = int(pidfile.read_text().strip())
        except (OSError, ValueError):
            return
        if _pid_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            end = time.monotonic() + timeout
            while _pid_alive(pid) and time.monotonic() < end:
                time.sleep(0.05)
            if _pid_alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        pidfile.unlink(missing_ok=True)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
