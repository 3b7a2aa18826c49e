"""Importing a .py file or module:Class in a child process, so that nothing the file does can take
the caller down.

Importing runs the file's code. Here it runs in a fresh `python -m agent_core.importers.isolated`
process: its own process group (killed as a whole, so grandchildren die too), stdin closed, a time
limit, stdout and stderr read into a bounded tail (a file that prints without end is stopped, never
buffered), and the program handed back as a project file in a private temporary folder, which the
parent loads with agent_core.project_file (JSON and .npz, never pickle). Every way the file can end
(sys.exit, os._exit, a signal, KeyboardInterrupt or another BaseException, a fork, a timeout, a flood
of output) becomes an ImportFailure with one line; cancel() from another thread stops it at once.

The child runs the in-process importers (`import_file`, `import_module`) unchanged.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from ..errors import ImportFailure

DEFAULT_TIMEOUT = 120.0
OUTPUT_LIMIT = 8 << 20          # bytes of stdout + stderr a file may print while it is imported
TAIL_BYTES = 16 << 10           # what is kept of each stream (for the last line of a crash)
_RESULT = "result.json"         # the child's verdict: {"ok": true} or {"ok": false, "message": ...}
_PROGRAM = "program.json"
_REQUEST = "request.json"
_STARTED = "started"            # made by the child just before the file runs: the time limit starts then
STARTUP_LIMIT = 300.0           # seconds the child may take to load torch and the importer (a loaded machine)
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class ImportCancelled(ImportFailure):
    """The import was cancelled (IsolatedImport.cancel) before it finished."""


def source_name(target: str) -> str:
    """How messages name what is imported: the file's name, or the module:Class target."""
    if ":" in target and not target.endswith(".py"):
        where, _, attr = target.rpartition(":")
        return f"{os.path.basename(where)}:{attr}" if where.endswith(".py") else target
    return os.path.basename(target) or target


class _Tail:
    """Reads one pipe to its end on a thread, keeping only its last TAIL_BYTES; tells `overflow`
    once the bytes read by all tails together pass OUTPUT_LIMIT."""

    def __init__(self, pipe, counter: list[int], lock: threading.Lock, overflow: threading.Event):
        self.pipe, self.counter, self.lock, self.overflow = pipe, counter, lock, overflow
        self.data = bytearray()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        # this thread closes the pipe itself: closed under a blocked read, its number could be reused
        # by another file, which the next read would then drain
        with self.pipe:
            self._drain(self.pipe.fileno())

    def _drain(self, fd: int) -> None:
        while True:
            try:
                chunk = os.read(fd, 1 << 16)
            except OSError:
                return
            if not chunk:
                return
            self.data += chunk
            if len(self.data) > TAIL_BYTES:
                del self.data[:-TAIL_BYTES]
            with self.lock:
                self.counter[0] += len(chunk)
                if self.counter[0] > OUTPUT_LIMIT:
                    self.overflow.set()

    def last_line(self) -> str:
        lines = [ln.strip() for ln in self.data.decode("utf-8", "replace").splitlines() if ln.strip()]
        return lines[-1][:300] if lines else ""


class IsolatedImport:
    """One import in a child process. run() blocks until it ends and returns the Program or raises
    ImportFailure; cancel() (from any thread) stops it, and run() then raises ImportCancelled.

    target: a .py file (KernelBench format) or 'pkg.mod:Class' / 'file.py:Class'.
    limit_hint: said after the limit when the import times out (what changes the limit, e.g. " (--timeout)").
    weights: False builds a .py file's model on the meta device (import_file(weights=False)): the
    program's parameters then have shapes but no data, and nothing large is created or handed back.
    """

    def __init__(self, target: str, *, timeout: float = DEFAULT_TIMEOUT, limit_hint: str = "",
                 weights: bool = True):
        if not timeout > 0:
            raise ImportFailure(f"the import time limit (--timeout) must be a positive number of seconds, "
                                f"got {timeout:g}")
        self.target, self.timeout, self.limit_hint = target, float(timeout), limit_hint
        self.weights = bool(weights)
        self.name = source_name(target)
        self._stop = threading.Event()

    def cancel(self) -> None:
        # run() kills the group within 20 ms: only it knows the child is not yet reaped (its id reused)
        self._stop.set()

    def run(self):
        kind = "file" if self.target.endswith(".py") else "module"
        folder = tempfile.mkdtemp(prefix="stitchcuda-import-")
        try:
            with open(os.path.join(folder, _REQUEST), "w") as f:
                json.dump({"kind": kind, "target": self.target, "sys_path": list(sys.path), "parent": os.getpid(),
                       "weights": self.weights}, f)
            return self._run_child(folder)
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    # the parent's side -------------------------------------------------------------------------------
    def _run_child(self, folder: str):
        env = dict(os.environ)
        # the child must find agent_core wherever the caller was started from
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
        env["PYTHONDONTWRITEBYTECODE"] = "1"   # importing a package writes no __pycache__ into the user's folder
        if self._stop.is_set():
            raise ImportCancelled(f"{self.name}: the import was cancelled")
        proc = subprocess.Popen(
            [sys.executable, "-m", "agent_core.importers.isolated", folder], stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, start_new_session=True)
        counter, lock, overflow = [0], threading.Lock(), threading.Event()
        tails = [_Tail(proc.stdout, counter, lock, overflow), _Tail(proc.stderr, counter, lock, overflow)]
        # the limit is the file's: it starts once the child has loaded torch and the importer
        started, deadline = os.path.join(folder, _STARTED), time.monotonic() + STARTUP_LIMIT
        running = False
        why = None
        try:
            while not _exited(proc):
                if not running and os.path.exists(started):
                    running, deadline = True, time.monotonic() + self.timeout
                if self._stop.wait(0.02):
                    why = "cancelled"
                elif overflow.is_set():
                    why = "output"
                elif time.monotonic() > deadline:
                    why = "timeout" if running else "startup"
                if why:
                    break
        finally:
            # whatever happened, nothing the file started outlives the import (grandchildren too)
            _kill_group(proc)
            rc = proc.wait()
            for t in tails:  # a process that left the group may hold the pipes: do not wait on it
                t.thread.join(timeout=2)
        if why is None and overflow.is_set():
            why = "output"
        if why == "cancelled" or self._stop.is_set():
            raise ImportCancelled(f"{self.name}: the import was cancelled")
        if why == "timeout":
            raise ImportFailure(f"{self.name}: importing took longer than {self.timeout:g} s{self.limit_hint} "
                                f"and was stopped")
        if why == "startup":
            raise ImportFailure(f"{self.name}: the import process did not get ready within {STARTUP_LIMIT:g} s "
                                f"(loading torch); the file did not run")
        if why == "output":
            raise ImportFailure(f"{self.name}: the file printed more than {OUTPUT_LIMIT >> 20} MiB while importing "
                                f"and was stopped; no program was made")
        return self._outcome(folder, rc, tails[1].last_line())

    def _outcome(self, folder: str, rc: int, last_err: str):
        result = _read_result(os.path.join(folder, _RESULT))
        if result is not None and not result.get("ok"):
            raise ImportFailure(str(result.get("message") or f"{self.name}: the import failed").replace("\n", " "))
        if result is not None and rc == 0:
            from ..project_file import load_program
            try:
                # its child wrote it a moment ago into this private folder: no other save's sidecar
                # can be there, so the arrays are not hashed again (sizes and shapes still checked)
                return load_program(os.path.join(folder, _PROGRAM), checksums=False)
            except ImportFailure:
                raise
            except Exception as e:  # the path is a throw-away folder: name the import instead
                msg = str(e).split(": ", 1)[-1] if folder in str(e) else str(e)
                raise ImportFailure(f"{self.name}: the imported program could not be read back: {msg}") from None
        if rc < 0:
            sig = -rc
            try:
                label = f"{signal.Signals(sig).name} ({signal.strsignal(sig)})"
            except ValueError:
                label = f"signal {sig}"
            raise ImportFailure(f"{self.name}: the import process was killed by {label} while importing; "
                                f"no program was made")
        hint = f" (last output: {last_err})" if rc != 0 and last_err else ""
        raise ImportFailure(f"{self.name}: the file ended the import process with exit status {rc} (os._exit or "
                            f"a crash) while importing; no program was made{hint}")


def _exited(proc: subprocess.Popen) -> bool:
    """Whether the child has exited, without reaping it: its process id (the group's id) stays
    reserved until the group is killed, so that kill can never reach an unrelated process."""
    if hasattr(os, "waitid"):
        try:
            return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        except ChildProcessError:
            return True
    return proc.poll() is not None


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        if hasattr(os, "killpg"):
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()
    except (ProcessLookupError, PermissionError):
        pass


def _read_result(path: str) -> dict | None:
    try:
        with open(path, "rb") as f:
            raw = f.read(1 << 16)
        result = json.loads(raw)
    except (OSError, ValueError):
        return None
    return result if isinstance(result, dict) else None


def import_isolated(target: str, *, timeout: float = DEFAULT_TIMEOUT, limit_hint: str = "", weights: bool = True):
    """The Program of a .py file or module:Class, imported in a child process (see IsolatedImport)."""
    return IsolatedImport(target, timeout=timeout, limit_hint=limit_hint, weights=weights).run()


# the child's side ---------------------------------------------------------------------------------------
_forked = False      # set in the importing process when the file forks
_in_fork = False     # set in a forked copy: it must never write the result


def _note_fork_parent() -> None:
    global _forked
    _forked = True


def _note_fork_child() -> None:
    global _in_fork
    _in_fork = True


def _verdict(name: str, exc: BaseException) -> str:
    """One line for an import that raised `exc`."""
    from .trace import _first_line
    if isinstance(exc, ImportFailure):
        return str(exc)
    if isinstance(exc, SystemExit):
        code = "" if exc.code is None else repr(exc.code)
        return f"{name}: the file called sys.exit({code}) while importing; no program was made"
    if isinstance(exc, KeyboardInterrupt):
        return f"{name}: the file raised KeyboardInterrupt while importing; no program was made"
    if isinstance(exc, Exception):  # a bug in the importer, not in the file
        return f"{name}: internal error in the importer ({_first_line(exc)})"
    return f"{name}: the file raised {_first_line(exc)} (a BaseException) while importing; no program was made"


def _die_with_parent(parent: int) -> None:
    """If the tool that started this import dies (kill -9, a crash), this process dies too, instead of
    running the file on with nobody left to enforce its time limit (Linux: PR_SET_PDEATHSIG)."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # it died before the line above took effect
        os._exit(1)


def _child(folder: str) -> None:
    with open(os.path.join(folder, _REQUEST)) as f:
        request = json.load(f)
    _die_with_parent(request["parent"])
    try:  # a crash of the file must not leave a core dump in the user's folder
        import resource
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    except (ImportError, ValueError, OSError):
        pass
    sys.path[:] = request["sys_path"]
    target, name = request["target"], source_name(request["target"])
    os.register_at_fork(after_in_parent=_note_fork_parent, after_in_child=_note_fork_child)
    result: dict
    try:
        from . import import_file, import_module
        open(os.path.join(folder, _STARTED), "w").close()
        program = (import_file(target, weights=request.get("weights", True)) if request["kind"] == "file"
                   else import_module(target))
        if _in_fork:
            os._exit(0)
        if _forked:
            result = {"ok": False, "message": f"{name}: the file forked a process while importing; importing "
                                              f"must not start processes that outlive it, so no program was made"}
        else:
            from ..project_file import save_program
            # a private folder the parent reads at once and deletes: no fsync of the weights
            save_program(program, os.path.join(folder, _PROGRAM), durable=False)
            result = {"ok": True}
    except BaseException as e:  # noqa: B902: every way the file can end is reported, not raised
        if _in_fork:
            os._exit(0)
        result = {"ok": False, "message": _verdict(name, e).replace("\n", " ")}
    with open(os.path.join(folder, _RESULT), "w") as f:
        json.dump(result, f)
    # skip interpreter shutdown: atexit handlers and threads the file left must not run or block
    os._exit(0)


if __name__ == "__main__":
    _child(sys.argv[1])
