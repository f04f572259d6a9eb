"""How Spark's Python processes start: on the install's compiled pyspark, connected back before imports.

Two costs of Spark 4.2's own start of a Python process, paid by every worker, daemon and driver it
starts, and both worst on a busy 2-core host, where they make queries fail:

- **pyspark from source.** Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` (and py4j's zip) first on
  a Python process's path. With pyspark installed from PyPI that zip sits inside the installed package
  and holds the same sources, without bytecode, so every process compiles the pyspark modules it
  imports: a daemon with its worker module 1.0 s of CPU against 0.2 s from the install's ``.pyc`` files,
  a streaming-source runner 1.4 s against 0.4 s (measured here). :func:`use_installed_pyspark` drops
  those two zips from ``sys.path`` when they belong to the installed pyspark and py4j, so the process
  imports the same code, compiled once at install.
- **A fixed 10 s to connect back.** Spark runs one long-lived Python process per source of each
  streaming query over a Python data source (``python -m
  pyspark.sql.streaming.python_streaming_source_runner``, ``PythonWorkerFactory.createSimpleWorker``)
  and waits for it to connect back for 10 s, hard-coded (``Selector.select(10000)``; no setting changes
  it). The process connects after its imports, which on a host where several streaming jobs start (the
  platform's five, load average 15-30) take longer. Spark then fails the query with "Python worker
  failed to connect back"; the job restarts it (:mod:`tidewater.streaming.runner`), and on such a host
  again and again (118 restarts in one ``./tw bench platform``, README, Benchmarks).
  :func:`connect_at_start` does at once, with the standard library alone, what pyspark's
  ``worker_util.get_sock_file_to_executor`` would do after the imports: connect, authenticate (the
  secret, length-prefixed; the JVM answers "ok") and send the pid. Then it hands the socket over:
  ``pyspark.worker_util`` is patched as it loads, so that its ``get_sock_file_to_executor`` gives that
  socket to its first caller instead of connecting again. What is left inside the 10 s is the
  interpreter's own start (~20 ms idle).

A third change is not about starting: a daemon (``python -m pyspark.daemon <worker module>``, from
which Spark forks the workers of one kind) imports what its workers will import before it forks any
(:mod:`tidewater.warm_daemon`), so they share those pages.

:func:`at_interpreter_start` runs all three from a ``.pth`` file as an interpreter of the install starts
(:func:`install` writes it; ``scripts/bootstrap.sh`` runs that). The file's one line imports this module
only in a process Spark started (``pyspark.zip`` on its ``PYTHONPATH``, or Spark's connect-back address in
its environment). Anything unexpected leaves Spark's and pyspark's own ways to run as before: zips of
another Spark, a pyspark whose ``worker_util`` has no such function, a refused connection or secret.
``TIDEWATER_WORKER_START=spark`` in a process's environment switches all three off. This module imports
nothing of tidewater's at import time (a runner's fork server and a daemon's warm-up are imported where
they are used): it runs in every Spark Python process.
"""

from __future__ import annotations

import importlib.machinery
import os
import socket
import struct
import sys
from collections.abc import Iterator, Mapping, Sequence

# Every Spark Python process imports this module as its interpreter starts, and a streaming-source runner
# handed to its fork server (tidewater.runner_forkserver) imports nothing else: what it imports is what
# each of them holds (importlib.abc, zipfile, pathlib and typing: ~6 MiB more a process). The others are
# imported where they are used.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path
    from typing import IO, Any

DAEMON = "pyspark.daemon"  # Spark forks the workers of each kind from a daemon running this module
SWITCH = "TIDEWATER_WORKER_START"  # "spark": start as Spark does, without this module's two changes
PTH_NAME = "tidewater-worker-start.pth"
# Where a process Spark started for one worker connects back to (a daemon gets neither).
PORT_VARIABLE, SOCK_PATH_VARIABLE = "PYTHON_WORKER_FACTORY_PORT", "PYTHON_WORKER_FACTORY_SOCK_PATH"
# Runs at every interpreter start of the install: it imports this module only in a process Spark started.
PTH_LINE = (
    f"import os; ('pyspark.zip' in os.environ.get('PYTHONPATH', '') or '{PORT_VARIABLE}' in os.environ"
    f" or '{SOCK_PATH_VARIABLE}' in os.environ)"
    " and __import__('tidewater.worker_start').worker_start.at_interpreter_start()\n"
)
HANDED_OVER = "get_sock_file_to_executor"

_connected: socket.socket | None = None
# site may run a .pth line more than once per interpreter (twice in our venvs, measured). A second
# connect would wait 15 s for a JVM that accepts no second worker: that once cost each query's start 12 s.
_started = False


def worker_module(argv: Sequence[str]) -> str | None:
    """The module a ``python [options] -m pyspark...`` command line runs, else None."""
    args = iter(argv[1:])
    for arg in args:
        if arg == "-m":
            module = next(args, "")
        elif arg.startswith("-m"):
            module = arg[2:]
        elif arg in ("-W", "-X"):  # options whose value is the next argument
            next(args, None)
            continue
        elif arg.startswith("-") and arg not in ("-", "-c"):
            continue
        else:
            return None  # a script, -c or stdin: the options end here
        return module if module.startswith("pyspark.") else None
    return None


def at_interpreter_start() -> None:
    """Both changes, once, in a process Spark started (the ``.pth`` line's call)."""
    global _started
    if _started or switched_off(os.environ):
        return
    _started = True
    try:
        use_installed_pyspark(sys.path)
        if worker_module(sys.orig_argv) == DAEMON:
            # a daemon imports what its workers will before it forks them
            from tidewater import warm_daemon

            warm_daemon.at_daemon_start(list(sys.orig_argv))
        elif connect_at_start() and _connected is not None:
            # a streaming-source runner hands its connection to its JVM's fork server, if it has one
            from tidewater import runner_forkserver

            runner_forkserver.hand_over(_connected, list(sys.orig_argv))
    except Exception as error:  # never in the way of the process: it then starts as Spark made it
        print(f"tidewater.worker_start: {error!r}; this process starts as Spark started it", file=sys.stderr)


def switched_off(environ: Mapping[str, str]) -> bool:
    """``TIDEWATER_WORKER_START=spark``: the process starts as Spark made it."""
    return environ.get(SWITCH, "").strip().lower() == "spark"


def use_installed_pyspark(path: list[str]) -> list[str]:
    """Drop from ``path`` the pyspark and py4j zips that belong to the installed pyspark; returns them.

    The zips Spark adds are ``<pyspark>/python/lib/pyspark.zip`` and ``py4j-<version>-src.zip``. Only a
    pyspark.zip inside the very pyspark package found further on the path is dropped (the same sources),
    and py4j's only beside it and when that same py4j version is installed next to the pyspark package.
    """
    packages = (os.path.join(os.path.normpath(p), "pyspark") for p in path if not p.endswith(".zip"))
    installed = next((package for package in packages if _is_package(package)), None)
    if installed is None:
        return []
    lib = os.path.join(installed, "python", "lib")
    site = os.path.dirname(installed)
    dropped = [
        p for p in path if os.path.dirname(os.path.normpath(p)) == lib and _is_installed_zip(os.path.normpath(p), site)
    ]
    path[:] = [p for p in path if p not in dropped]
    return dropped


def _is_package(directory: str) -> bool:
    return os.path.isfile(os.path.join(directory, "__init__.py"))


def _is_installed_zip(archive: str, site: str) -> bool:
    name = os.path.basename(archive)
    if name == "pyspark.zip":
        return True
    prefix, suffix = "py4j-", "-src.zip"
    if name.startswith(prefix) and name.endswith(suffix):
        version = name[len(prefix) : -len(suffix)]
        return _is_package(os.path.join(site, "py4j")) and os.path.isdir(
            os.path.join(site, f"py4j-{version}.dist-info")
        )
    return False


def connect_at_start(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> bool:
    """Connect this Spark worker back to its JVM now and hand the socket to pyspark; True if it did."""
    argv = sys.orig_argv if argv is None else argv
    environ = os.environ if environ is None else environ
    if switched_off(environ) or worker_module(argv) is None:
        return False
    if PORT_VARIABLE not in environ and SOCK_PATH_VARIABLE not in environ:
        return False  # a daemon: its workers are forked and handed their sockets, nothing to connect
    if not _pyspark_hands_over():  # reads a file: only where a connect follows
        return False
    try:
        sock = connect(environ)
    except (OSError, ValueError, KeyError, struct.error):
        return False  # pyspark's own connect runs and reports
    global _connected
    _connected = sock
    sys.meta_path.insert(0, _PatchWorkerUtil())
    return True


def connect(environ: Mapping[str, str]) -> socket.socket:
    """Spark's worker handshake, as ``pyspark.worker_util.get_sock_file_to_executor`` does it."""
    timeout = int(environ.get("SPARK_AUTH_SOCKET_TIMEOUT", 15))
    secret = environ.get("PYTHON_WORKER_FACTORY_SECRET")
    path = environ.get(SOCK_PATH_VARIABLE)
    if path is not None and secret is None:  # a Unix domain socket: no secret
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(path)
        except OSError:
            sock.close()
            raise
    else:
        host = "::1" if environ.get("SPARK_PREFER_IPV6", "false").lower() == "true" else "127.0.0.1"
        sock = socket.create_connection((host, int(environ[PORT_VARIABLE])), timeout=timeout)
    try:
        if secret is not None:
            encoded = secret.encode("utf-8")
            sock.sendall(struct.pack("!i", len(encoded)) + encoded)
            (length,) = struct.unpack("!i", _read_exactly(sock, 4))
            if _read_exactly(sock, length).decode("utf-8") != "ok":
                raise ConnectionRefusedError("the JVM refused the worker's secret")
        sock.sendall(struct.pack("!i", os.getpid()))
    except (OSError, struct.error, UnicodeDecodeError):
        sock.close()
        raise
    return sock


def take_connected() -> socket.socket | None:
    """The socket :func:`connect_at_start` opened, once; None after that or if it opened none."""
    global _connected
    sock, _connected = _connected, None
    return sock


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionResetError("the JVM closed the connection")
        data += chunk
    return data


def _pyspark_hands_over() -> bool:
    """Whether the pyspark this process imports has a worker_util with the function the socket goes through."""
    spec = importlib.machinery.PathFinder.find_spec("pyspark")  # finds the package, does not run it
    for location in (spec.submodule_search_locations or []) if spec else []:
        try:
            if ".zip" + os.sep in location:  # Spark's pyspark.zip when it is not the install's
                import zipfile

                archive, inner = location.split(".zip" + os.sep, 1)
                try:
                    with zipfile.ZipFile(archive + ".zip") as opened:
                        source = opened.read(f"{inner}/worker_util.py").decode("utf-8")
                except (KeyError, zipfile.BadZipFile):
                    continue
            else:
                with open(os.path.join(location, "worker_util.py"), encoding="utf-8") as handle:
                    source = handle.read()
        except OSError:
            continue
        return f"def {HANDED_OVER}(" in source
    return False


def patch_worker_util(module: Any) -> None:
    """Make ``module.get_sock_file_to_executor`` give the socket opened at start to its first caller."""
    import contextlib

    original = getattr(module, HANDED_OVER)

    @contextlib.contextmanager
    def get_sock_file_to_executor(timeout: int | None = -1) -> Iterator[IO[bytes]]:
        sock = take_connected()
        if sock is None:
            with original(timeout) as sock_file:
                yield sock_file
            return
        if timeout is None or timeout > 0:
            sock.settimeout(timeout)
        sock_file = sock.makefile("rwb", int(os.environ.get("SPARK_BUFFER_SIZE", 65536)))
        try:
            yield sock_file
        finally:
            sock_file.close()

    setattr(module, HANDED_OVER, get_sock_file_to_executor)


class _PatchWorkerUtil:
    """Patches ``pyspark.worker_util`` as it loads, before a worker module binds its functions (a meta
    path finder: ``find_spec`` is all ``sys.meta_path`` asks of one)."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != "pyspark.worker_util":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            loader_exec = spec.loader.exec_module

            def exec_module(module: Any) -> None:
                loader_exec(module)
                patch_worker_util(module)

            spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install(site_packages: Path | None = None) -> Path:
    """Write the ``.pth`` file into the install's site-packages (atomically; unchanged if current)."""
    import sysconfig
    import tempfile
    from pathlib import Path

    target = Path(site_packages or sysconfig.get_paths()["purelib"]) / PTH_NAME
    if target.exists() and target.read_text(encoding="utf-8") == PTH_LINE:
        return target
    handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=".tidewater-pth-")
    with os.fdopen(handle, "w", encoding="utf-8") as out:
        out.write(PTH_LINE)
    os.chmod(temporary, 0o644)
    os.replace(temporary, target)
    return target


if __name__ == "__main__":
    try:
        install()
    except OSError as error:
        print(
            f"tidewater: Spark's Python processes start as Spark makes them (no {PTH_NAME}: {error})", file=sys.stderr
        )
        sys.exit(1)
