"""Spark standalone on hosts: a master and workers from pyspark's own distribution
(`$SPARK_HOME/bin/spark-class org.apache.spark.deploy.master.Master` / `...Worker`, the
SPARK_HOME being the pyspark package directory), each in a network-namespace host
(tests/multihost/hosts.py), bound to that host's address and known by its host name (the
/etc/hosts the harness writes, as DNS would name them on a real LAN).

Sized for a small shared machine: each daemon JVM gets 256 MiB, each worker offers one
core and 1 GiB to executors. Every directory Spark writes (the workers' application
directories, executors' scratch space, logs) is under the test's own directory.

The processes run in the foreground (spark-class, not the sbin/ daemon scripts), so the
harness holds them and kills them with their hosts. Their log goes to stderr, which the
harness writes to WORKDIR/LABEL.log; readiness is a line in that log.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

from pyspark.find_spark_home import _find_spark_home

from tests.multihost.hosts import Host, Proc, WorkerError

SPARK_HOME = Path(_find_spark_home())
SPARK_CLASS = str(SPARK_HOME / "bin" / "spark-class")
MASTER_PORT = 7077
# The JVM of an executor, as a worker starts it (one per application per worker).
EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
# Options of every Spark JVM here (the daemons', the driver's and the executors'): the
# client compiler only and the serial collector cut a JVM's start-up CPU by about half,
# which on a two-core machine shared by seven JVMs is most of the test's time; their
# work is too small for the optimising compiler to pay off.
JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


README = Path(__file__).resolve().parents[2] / "README.md"


def readme_spark_submit(fill: dict[str, str]) -> tuple[str, dict[str, str]]:
    """The master URL and the `--conf` settings of the README's `spark-submit` recipe
    (section "Spark"), as written there, each placeholder value replaced by fill's."""
    text = README.read_text()
    section = text[text.index("## Spark") : text.index("## Command line")]
    block = re.search(r"```sh\n(spark-submit .*?)```", section, flags=re.S)
    if block is None:
        raise AssertionError("README: no `spark-submit` block in the Spark section")
    words = shlex.split(block.group(1).replace("\\\n", " "))
    master = words[words.index("--master") + 1]
    confs = dict(words[i + 1].split("=", 1) for i, word in enumerate(words) if word == "--conf")
    for placeholder in fill:
        assert placeholder in [master, *confs.values()], f"README recipe lost its {placeholder}"
    return fill.get(master, master), {k: fill.get(v, v) for k, v in confs.items()}


def spark_env(host: Host, workdir: Path) -> dict[str, str]:
    """What every Spark process on `host` needs (added to the harness environment, which
    already puts this checkout first on PYTHONPATH): bind to the host's address and
    advertise its name, write only under workdir, run this venv's Python for PySpark."""
    scratch = workdir / f"local-{host.name}"
    scratch.mkdir(parents=True, exist_ok=True)
    return {
        "SPARK_HOME": str(SPARK_HOME),
        # Without these Spark binds what the machine's host name resolves to, which in a
        # namespace is nothing reachable.
        "SPARK_LOCAL_IP": host.address,
        "SPARK_LOCAL_HOSTNAME": host.name,
        "SPARK_LOCAL_DIRS": str(scratch),
        "SPARK_DAEMON_MEMORY": "256m",
        "SPARK_DAEMON_JAVA_OPTS": JVM_OPTIONS,
        # Executors start their Python workers with the driver's choice
        # (spark.pyspark.python); the workers' own environment says the same.
        "PYSPARK_PYTHON": sys.executable,
    }


def wait_log(proc: Proc, text: str, timeout_s: float) -> str:
    """The first line of proc's log (its stderr) containing text; fails if proc exits
    first or nothing comes within timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            lines = proc.log.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            lines = []
        found = next((line for line in lines if text in line), None)
        if found is not None:
            return found
        if proc.popen.poll() is not None:
            raise WorkerError(f"{proc.name} exited {proc.popen.returncode}{proc.tail()}")
        if time.monotonic() > deadline:
            raise WorkerError(f"{proc.name}: no {text!r} within {timeout_s}s{proc.tail()}")
        time.sleep(0.1)  # a log file has nothing to block on: poll it, bounded


def count_log(proc: Proc, text: str) -> int:
    """How many lines of proc's log contain text."""
    return sum(text in line for line in proc.log.read_text(errors="replace").splitlines())


class SparkMaster:
    """The standalone master on its host, at spark://NAME:7077."""

    def __init__(self, host: Host, workdir: Path) -> None:
        self.host = host
        self.workdir = workdir
        self.url = f"spark://{host.name}:{MASTER_PORT}"
        self.proc: Proc | None = None

    def launch(self) -> SparkMaster:
        """Start it; wait_ready() waits until it serves (start other things meanwhile:
        a JVM takes seconds to start)."""
        argv = [SPARK_CLASS, "org.apache.spark.deploy.master.Master",
                "--host", self.host.name, "--port", str(MASTER_PORT)]  # fmt: skip
        env = spark_env(self.host, self.workdir)
        self.proc = self.host.popen(argv, label="spark-master", env=env, cwd=self.workdir)
        return self

    def wait_ready(self, timeout_s: float = 60.0) -> SparkMaster:
        assert self.proc is not None
        wait_log(self.proc, "I have been elected leader! New state: ALIVE", timeout_s)
        return self


class SparkWorker:
    """A standalone worker on its host, offering `cores` cores and `memory` to
    executors; its applications' directories (executor logs) under workdir."""

    def __init__(
        self, host: Host, master_url: str, workdir: Path, cores: int = 1, memory: str = "1g"
    ) -> None:
        self.host = host
        self.master_url = master_url
        self.workdir = workdir
        self.work_dir = workdir / f"worker-{host.name}"
        self.cores = cores
        self.memory = memory
        self.proc: Proc | None = None

    def launch(self) -> SparkWorker:
        """Start it; wait_registered() waits until the master took it (launch several,
        then wait: their JVMs start in parallel)."""
        self.work_dir.mkdir(parents=True, exist_ok=True)
        argv = [SPARK_CLASS, "org.apache.spark.deploy.worker.Worker",
                "--host", self.host.name, "--cores", str(self.cores), "--memory", self.memory,
                "--work-dir", str(self.work_dir), self.master_url]  # fmt: skip
        env = spark_env(self.host, self.workdir)
        self.proc = self.host.popen(
            argv, label=f"spark-worker-{self.host.name}", env=env, cwd=self.workdir
        )
        return self

    def wait_registered(self, timeout_s: float = 60.0) -> SparkWorker:
        assert self.proc is not None
        wait_log(self.proc, "Successfully registered with master", timeout_s)
        return self

    def wait_executors_launched(self, count: int, timeout_s: float) -> None:
        """Wait until the master has asked this worker to launch `count` executors (it
        asks again when one dies while the application wants its cores)."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while (launched := count_log(self.proc, "Asked to launch executor")) < count:
            if time.monotonic() > deadline:
                raise WorkerError(
                    f"{self.proc.name}: {launched} executors of {count} within {timeout_s}s"
                    f"{self.proc.tail()}"
                )
            time.sleep(0.1)  # a log file has nothing to block on: poll it, bounded


def executor_pids(host: Host) -> list[int]:
    """The executor JVMs running in host's namespace now."""
    pids = subprocess.run(
        ["ip", "netns", "pids", host.ns], capture_output=True, text=True, timeout=30, check=True
    ).stdout.split()
    found = []
    for pid in pids:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except FileNotFoundError:  # (gone since it was listed)
            continue
        if EXECUTOR_CLASS.encode() in cmdline:
            found.append(int(pid))
    return found
