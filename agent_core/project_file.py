"""The project file: a Program as versioned JSON, with large parameters in a sidecar .npz.

Loading never executes code and never unpickles: the JSON is parsed with the json module, every field
is checked for type and range, ops must be known to the registry, and the sidecar is read member by
member with numpy's header reader (no pickle), its shape, dtype and SHA-256 checked against the JSON.
Any problem raises FileFormatError naming the JSON path ("nodes[3].inputs[1]: ...").

Saving is atomic: each file is written to a temporary file in the same folder
(`.<name>.<random>.stitchcuda-tmp`, locked while its save runs), fsynced and renamed over the old one,
so a crash mid-save leaves the old file whole; the temporary files a killed save leaves are removed by
the next save or open of that file. A sidecar is only ever read as a regular file in the project
file's own folder, never through a link. The schema is described in docs/PROJECT_FILE.md.
"""
from __future__ import annotations

import base64
import hashlib
import json
import math
import os
import re
import shutil
import stat
import struct
import tempfile
import time
import tokenize
import zipfile
import zlib
from enum import Enum
from typing import Any

try:
    import fcntl  # POSIX: a live save's temporary file is locked, so no one removes it under it
except ImportError:  # pragma: no cover - Windows
    fcntl = None

import numpy as np

from .errors import FileFormatError, ProgramError
from .ir import Node, Program, Role, SOURCE_ROLES, Value
from .ops import DTYPE_BYTES, REGISTRY, get_op

FORMAT = "stitchcuda-program"
SCHEMA_VERSION = 1
INLINE_LIMIT = 4096            # parameters with at most this many elements are stored inline

# Limits against hostile files: generous for real programs, small enough to fail fast.
MAX_FILE_BYTES = 512 << 20
MAX_ITEMS = 1_000_000          # nodes, values, parameters
MAX_ID = 64
MAX_NAME = 1000
MAX_TEXT = 8 << 20             # one free-form string (generated source lives in regions)
MAX_DEPTH = 64                 # nesting of free-form sections (attrs, regions, log, profile, metadata)
MAX_RANK = 32
MAX_NUMEL = 1 << 40            # elements of one tensor (a few TB; more is a corrupt file)

# Dtypes numpy can hold exactly (bfloat16 has no numpy type: such parameters are stored as float32).
DATA_DTYPES = ("float32", "float64", "float16", "int64", "int32", "int8", "uint8", "bool")

_ID_RE = re.compile(r"^[A-Za-z0-9_.:\-]+$")
_TOP_KEYS = ("format", "schema_version", "name", "next_id", "inputs", "outputs", "values", "nodes",
             "parameters", "regions", "log", "profile", "metadata")
_VALUE_KEYS = ("id", "name", "shape", "dtype", "role", "producer", "init")
_NODE_KEYS = ("id", "op", "name", "attrs", "inputs", "outputs", "pos")
_FLOAT_TAG = "$float"

# Temporary files of a save: ".<target name>.<8 random characters>.stitchcuda-tmp", next to the target.
TMP_SUFFIX = ".stitchcuda-tmp"
# One not locked by a live save is an orphan once it is this old; the grace covers the instant between
# a save creating its file and locking it (without fcntl, no lock: only files an hour old are orphans).
ORPHAN_GRACE_S = 1.0 if fcntl is not None else 3600.0


# --- public API ------------------------------------------------------------------------------
def save_program(program: Program, path: str | os.PathLike, *, inline_limit: int = INLINE_LIMIT,
                 durable: bool = True) -> None:
    """Write `program` to `path` (JSON) and, if it has large parameters, `<path>.npz`, atomically.
    durable=False skips the fsyncs, for a throw-away folder read back at once (an isolated import's)."""
    path = os.path.realpath(os.fspath(path))  # through a symlink: update its target, keep the link
    sidecar_name = os.path.basename(path) + ".npz"
    sidecar = os.path.join(os.path.dirname(path), sidecar_name)
    remove_orphans(path)
    large: dict[str, np.ndarray] = {}
    obj = _to_json(program, inline_limit=inline_limit, sidecar=sidecar_name, large=large)
    text = _format(obj)
    if large:
        want = [e for e in obj["parameters"] if "sidecar" in e]
        # An unchanged sidecar is left alone. A changed one also keeps the arrays the JSON now on disk
        # reads, so that a crash between the two renames leaves a loadable pair either way. A sidecar
        # that is a link or not a regular file is never read: the rename replaces the entry itself.
        if not _sidecar_holds(sidecar, want):
            keep = _members_read_by(path, sidecar_name)
            _atomic_write(sidecar, lambda f: _write_npz(f, {_member(e): large[e["value"]] for e in want},
                                                        sidecar, keep), durable)
    _atomic_write(path, lambda f: f.write(text.encode("utf-8")), durable)
    if not large:  # a sidecar left from an earlier save is no longer referenced (only a file we wrote)
        try:
            if stat.S_ISREG(os.lstat(sidecar).st_mode):
                os.unlink(sidecar)
        except FileNotFoundError:
            pass


def remove_orphans(path: str | os.PathLike) -> list[str]:
    """Remove the temporary files that killed saves of `path` (and of its sidecar) left in its folder.

    Only names of our own pattern for exactly this target are considered, only regular files, and
    only those no live save holds locked and that are older than ORPHAN_GRACE_S. Returns the names
    removed; a folder that cannot be listed or written is left as it is."""
    path = os.path.realpath(os.fspath(path))
    folder, base = os.path.split(path)
    pattern = re.compile(r"\.(" + re.escape(base) + r"|" + re.escape(base + ".npz") + r")\.[A-Za-z0-9_]{8}"
                         + re.escape(TMP_SUFFIX))
    removed = []
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    for name in names:
        if pattern.fullmatch(name) and _remove_if_orphan(os.path.join(folder, name)):
            removed.append(name)
    return removed


def _remove_if_orphan(tmp: str) -> bool:
    try:
        fd = os.open(tmp, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False  # gone, a link, or not ours to open
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or time.time() - st.st_mtime < ORPHAN_GRACE_S:
            return False
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return False  # a save in another process is writing it now
        try:
            same = os.lstat(tmp)
            if (same.st_dev, same.st_ino) != (st.st_dev, st.st_ino):
                return False  # replaced meanwhile: not the file we checked
            os.unlink(tmp)
        except OSError:
            return False
        return True
    finally:
        os.close(fd)


def load_program(path: str | os.PathLike, *, strict: bool = False, checksums: bool = True) -> Program:
    """Read a project file into a fresh Program.

    Structural problems (bad JSON, wrong types, unknown ops, dangling references, duplicate ids,
    cycles, sidecar mismatches) raise FileFormatError. Other validation errors (an unconnected port,
    a node whose shapes no longer infer) are what a half-built graph in the editor has; they are kept
    on node.error unless strict=True, which raises the first of them. checksums=False skips hashing
    the sidecar's arrays (whose shapes, dtypes and sizes are still checked): for a file written a moment
    ago into a private folder (an isolated import's), where no other save's sidecar can be.
    """
    path = os.fspath(path)
    try:
        # O_NONBLOCK: a FIFO or device named like a project file must not hang the open
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        with open(fd, "rb") as f:
            mode = os.fstat(f.fileno()).st_mode
            if stat.S_ISDIR(mode):
                raise IsADirectoryError
            if not stat.S_ISREG(mode):
                raise FileFormatError(f"{path}: not a regular file")
            raw = f.read(MAX_FILE_BYTES + 1)  # bounded even if the size on disk lies
        if len(raw) > MAX_FILE_BYTES:
            raise FileFormatError(f"{path}: larger than the {MAX_FILE_BYTES >> 20} MiB a project file may have")
    except FileNotFoundError:
        raise FileFormatError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise FileFormatError(f"{path}: is a folder, not a project file") from None
    except OSError as e:
        raise FileFormatError(f"{path}: cannot read ({e.strerror or e})") from None
    obj = _parse(raw, path)
    real = os.path.realpath(path)  # the sidecar lies next to the file itself, not next to a link to it
    try:
        program = program_from_json(obj, base_dir=os.path.dirname(real), strict=strict, checksums=checksums)
    except FileFormatError as e:
        raise FileFormatError(f"{path}: {e}") from None
    remove_orphans(real)  # only after a good load: opening a bad file changes nothing
    return program


def program_to_json(program: Program) -> dict:
    """The program as a JSON-compatible dict with all parameter data inline (save_program puts
    large arrays in a sidecar instead)."""
    return _to_json(program, inline_limit=None, sidecar=None, large=None)


def program_from_json(obj: Any, base_dir: str | os.PathLike | None = None, *, strict: bool = False,
                      checksums: bool = True) -> Program:
    """Build a fresh Program from a parsed project file; base_dir is where its sidecar lies."""
    return _Reader(obj, None if base_dir is None else os.fspath(base_dir), checksums).read(strict)


def dumps(program: Program) -> str:
    """Self-contained text (all data inline) for the clipboard or a message."""
    return json.dumps(program_to_json(program), separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def loads(text: str | bytes, *, strict: bool = False) -> Program:
    """The inverse of dumps (also reads a project file's text that has no sidecar)."""
    raw = text.encode("utf-8") if isinstance(text, str) else bytes(text)
    if len(raw) > MAX_FILE_BYTES:
        raise FileFormatError(f"text of {len(raw)} bytes is larger than a project may be")
    return program_from_json(_parse(raw, "text"), None, strict=strict)


# --- writing ---------------------------------------------------------------------------------
def _to_json(program: Program, *, inline_limit, sidecar, large) -> dict:
    for vid in program.data:
        v = program.values.get(vid)
        if v is None or v.role not in (Role.PARAMETER, Role.CONSTANT):
            what = "not a value" if v is None else _a(v.role.value)
            raise FileFormatError(f"cannot save: program data holds '{vid}', which is {what}")
    params = []
    for vid, arr in program.data.items():
        arr = np.asarray(arr)
        entry = {"value": vid, **_array_header(arr, vid)}
        if inline_limit is None or arr.size <= inline_limit:
            entry["data"] = base64.b64encode(_le_bytes(arr)).decode("ascii")
        else:
            entry["sidecar"] = sidecar
            entry["sha256"] = hashlib.sha256(_le_view(arr)).hexdigest()
            large[vid] = arr
        params.append(entry)
    return {
        "format": FORMAT,
        "schema_version": SCHEMA_VERSION,
        "name": program.name,
        "next_id": program._next_id,
        "inputs": list(program.inputs),
        "outputs": list(program.outputs),
        "values": [{"id": v.id, "name": v.name, "shape": [int(d) for d in v.shape], "dtype": v.dtype,
                    "role": Role(v.role).value, "producer": v.producer,
                    "init": _plain(v.init, f"values.{v.id}.init")}
                   for v in program.values.values()],
        "nodes": [{"id": n.id, "op": n.op, "name": n.name, "attrs": _plain(n.attrs, f"nodes.{n.id}.attrs"),
                   "inputs": list(n.inputs), "outputs": list(n.outputs),
                   "pos": _pos(n)}
                  for n in program.nodes.values()],
        "parameters": params,
        "regions": [_plain(r.to_dict() if hasattr(r, "to_dict") else r, f"regions[{i}]")
                    for i, r in enumerate(program.regions)],
        "log": _plain(list(program.log), "log"),
        "profile": _plain(program.profile, "profile"),
        "metadata": _plain(dict(program.metadata), "metadata"),
    }


def _pos(n: Node) -> list[float] | None:
    if n.pos is None:
        return None
    x, y = float(n.pos[0]), float(n.pos[1])
    if not (math.isfinite(x) and math.isfinite(y)):
        raise FileFormatError(f"cannot save node {n.name} ({n.id}): its canvas position {n.pos} is not finite")
    return [x, y]


def _format(obj: dict) -> str:
    """JSON with one top-level key per line and one node / value / parameter per line (readable,
    and a diff of two saves shows which nodes changed)."""
    def one(x):
        return json.dumps(x, ensure_ascii=False, allow_nan=False, separators=(", ", ": "))
    lines = []
    for k, v in obj.items():
        if isinstance(v, list) and v and k in ("values", "nodes", "parameters", "regions", "log"):
            body = ",\n".join("  " + one(item) for item in v)
            lines.append(f"{one(k)}: [\n{body}\n ]")
        else:
            lines.append(f"{one(k)}: {one(v)}")
    return "{\n " + ",\n ".join(lines) + "\n}\n"


def _array_header(arr: np.ndarray, vid: str) -> dict:
    name = arr.dtype.name
    if name not in DATA_DTYPES:
        raise FileFormatError(f"cannot save parameter '{vid}': dtype {name} is not one of "
                              f"{', '.join(DATA_DTYPES)}")
    return {"dtype": name, "shape": [int(d) for d in arr.shape]}


def _le(arr: np.ndarray) -> np.ndarray:
    """Little-endian, C order, shape kept (np.ascontiguousarray would turn a 0-d array into 1-d)."""
    return np.asarray(arr, dtype=arr.dtype.newbyteorder("<"), order="C")


def _le_bytes(arr: np.ndarray) -> bytes:
    return _le(arr).tobytes()


def _le_view(arr: np.ndarray) -> memoryview:
    """The little-endian C-order bytes of arr without copying them (a weight can be gigabytes)."""
    return memoryview(_le(arr).reshape(-1)).cast("B")


def _write_npy(m, arr: np.ndarray) -> None:
    """np.lib.format.write_array for our arrays (little-endian, C order, no objects), writing the data
    from a view: write_array copies it chunk by chunk into bytes for anything but a real file."""
    a = _le(arr)
    header = np.lib.format.header_data_from_array_1_0(a)
    try:
        np.lib.format.write_array_header_1_0(m, header)
    except ValueError:                        # a header longer than 1.0 allows
        np.lib.format.write_array_header_2_0(m, header)
    if a.size:
        m.write(_le_view(a))


def _plain(x: Any, path: str, depth: int = 0) -> Any:
    """x as plain JSON types; non-finite floats become {"$float": "nan" | "inf" | "-inf"} so the file
    stays strict JSON and NaN compares equal after a round trip."""
    if depth > MAX_DEPTH:
        raise FileFormatError(f"cannot save {path}: nested deeper than {MAX_DEPTH} levels")
    if isinstance(x, Enum):
        x = x.value
    if x is None or isinstance(x, (bool, str)) and type(x) in (bool, str):
        return x
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, bool):
        return bool(x)
    if isinstance(x, int):
        return int(x)
    if isinstance(x, float):
        if math.isfinite(x):
            return float(x)
        return {_FLOAT_TAG: "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")}
    if isinstance(x, str):
        return str.__str__(x)
    if isinstance(x, dict):
        out = {}
        for k, v in x.items():
            if isinstance(k, Enum):
                k = k.value
            if isinstance(k, bool) or not isinstance(k, (str, int)):
                raise FileFormatError(f"cannot save {path}: key {k!r} is not a string")
            out[str(k)] = _plain(v, f"{path}.{k}", depth + 1)
        return out
    if isinstance(x, (list, tuple)):
        return [_plain(v, f"{path}[{i}]", depth + 1) for i, v in enumerate(x)]
    raise FileFormatError(f"cannot save {path}: {_a(type(x).__name__)} is not plain data")


def _atomic_write(path: str, write, durable: bool = True) -> None:
    """Write through a temporary file in the same folder, fsync (when durable), then rename over
    `path`. The file stays open and locked until it has its name, so remove_orphans never takes it for
    an orphan."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=TMP_SUFFIX, dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            if fcntl is not None:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            write(f)
            f.flush()
            if durable:
                os.fsync(f.fileno())
            try:  # keep the old file's permissions (a link's target's are not the old file's)
                old = os.lstat(path)
                mode = stat.S_IMODE(old.st_mode) if stat.S_ISREG(old.st_mode) else None
            except FileNotFoundError:
                mode = None
            os.fchmod(f.fileno(), 0o666 & ~_umask() if mode is None else mode)
            os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if not durable:
        return
    try:  # make the rename itself durable
        dfd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


def _umask() -> int:
    """The process umask, read without os.umask(), which would change it for other threads meanwhile."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


def _member(entry: dict) -> str:
    """Sidecar member of an array: value id and checksum, so two saves' arrays can sit side by side."""
    return f"{entry['value']}.{entry['sha256'][:16]}.npy"


def _write_npz(f, arrays: dict[str, np.ndarray], old_path: str, keep: set[str]) -> None:
    with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED, allowZip64=True) as z:
        for name, arr in arrays.items():
            with z.open(name, "w", force_zip64=True) as m:
                _write_npy(m, arr)
        keep = keep - set(arrays)
        if not keep:
            return
        try:
            with _open_sidecar(old_path) as raw, zipfile.ZipFile(raw) as old:
                for info in old.infolist():
                    if info.filename in keep:
                        with old.open(info) as src, z.open(info.filename, "w", force_zip64=True) as dst:
                            shutil.copyfileobj(src, dst, 1 << 20)
        except (FileFormatError, zipfile.BadZipFile, OSError, EOFError):
            pass  # the old pair was broken already (or its sidecar is not ours to read): nothing to keep


def _sidecar_holds(path: str, want: list[dict]) -> bool:
    try:
        _read_sidecar(path, want, check_only=True)
        return True
    except FileFormatError:
        return False


def _members_read_by(path: str, sidecar_name: str) -> set[str]:
    """Sidecar members the project file now at `path` reads (none if it is absent or unreadable)."""
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_FILE_BYTES:  # a FIFO would hang the open
            return set()
        with open(path, "rb") as f:
            old = json.loads(f.read().decode("utf-8"))
        return {_member(e) for e in old["parameters"]
                if isinstance(e, dict) and e.get("sidecar") == sidecar_name
                and isinstance(e.get("value"), str) and isinstance(e.get("sha256"), str)}
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return set()


# --- reading ---------------------------------------------------------------------------------
def _parse(raw: bytes, where: str) -> Any:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FileFormatError(f"{where}: not UTF-8 text (byte {e.start}); is this a project file?") from None
    if not text.strip():
        raise FileFormatError(f"{where}: the file is empty")

    def no_duplicates(pairs):
        keys = [k for k, _ in pairs]
        if len(set(keys)) != len(keys):
            dup = next(k for k in keys if keys.count(k) > 1)
            raise FileFormatError(f"{where}: key '{dup[:40]}' appears twice in one JSON object")
        return dict(pairs)

    def bad_constant(name):
        raise FileFormatError(f"{where}: {name} is not JSON (non-finite numbers are written as "
                              f'{{"{_FLOAT_TAG}": "nan"}})')

    try:
        return json.loads(text, object_pairs_hook=no_duplicates, parse_constant=bad_constant)
    except json.JSONDecodeError as e:
        hint = " (the file is truncated)" if e.pos >= len(text.rstrip()) else ""
        raise FileFormatError(f"{where}: not valid JSON{hint}: {e.msg} at line {e.lineno} column {e.colno}") from None
    except RecursionError:
        raise FileFormatError(f"{where}: JSON nested too deeply") from None
    except ValueError as e:  # e.g. an integer literal with thousands of digits
        raise FileFormatError(f"{where}: not valid JSON: {e}") from None


def _a(word: str) -> str:
    return ("an " if word[:1] in "aeiou" else "a ") + word


def _type_name(x: Any) -> str:
    if x is None:
        return "null"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "an object"}.get(type(x), type(x).__name__)


class _Reader:
    """Checks a parsed file path by path and builds the Program."""

    def __init__(self, obj: Any, base_dir: str | None, checksums: bool = True):
        self.obj = obj
        self.base_dir = base_dir
        self.checksums = checksums

    # small checkers, each naming the path ---------------------------------------------------
    @staticmethod
    def fail(path: str, msg: str):
        raise FileFormatError(f"{path}: {msg}" if path else msg)

    def typed(self, x, types, path, what):
        if isinstance(x, bool) and bool not in types or not isinstance(x, types):
            self.fail(path, f"must be {what}, got {_type_name(x)}")
        return x

    def obj_keys(self, x, path, keys, optional=()):
        self.typed(x, (dict,), path, "an object")
        missing = [k for k in keys if k not in x and k not in optional]
        if missing:
            self.fail(path, f"missing key '{missing[0]}'")
        extra = [k for k in x if k not in keys]
        if extra:
            self.fail(path, f"unknown key '{str(extra[0])[:40]}'")
        return x

    def string(self, x, path, limit=MAX_NAME, nullable=False):
        if x is None and nullable:
            return None
        self.typed(x, (str,), path, "a string")
        if len(x) > limit:
            self.fail(path, f"a string of {len(x)} characters is longer than the {limit} allowed")
        return x

    def ident(self, x, path, nullable=False):
        if x is None and nullable:
            return None
        self.string(x, path, MAX_ID)
        if not _ID_RE.match(x):
            self.fail(path, f"'{x}' is not a valid id (letters, digits, _ . : -)")
        return x

    def integer(self, x, path, lo=None, hi=None):
        self.typed(x, (int,), path, "an integer")
        if lo is not None and x < lo or hi is not None and x > hi:
            self.fail(path, f"{x} is out of range" + (f" ({lo} to {hi})" if hi is not None else f" (at least {lo})"))
        return x

    def array(self, x, path, limit=MAX_ITEMS):
        self.typed(x, (list,), path, "a list")
        if len(x) > limit:
            self.fail(path, f"{len(x)} entries is more than the {limit} allowed")
        return x

    def shape(self, x, path) -> tuple[int, ...]:
        self.array(x, path, MAX_RANK)
        dims = []
        for i, d in enumerate(x):
            if isinstance(d, bool) or not isinstance(d, int):
                self.fail(f"{path}[{i}]", f"a dimension must be an integer, got {_type_name(d)}")
            if d < 0:
                self.fail(f"{path}[{i}]", f"negative dimension {d}")
            if d > MAX_NUMEL:
                self.fail(f"{path}[{i}]", f"dimension {d} is absurdly large (limit {MAX_NUMEL})")
            dims.append(d)
        numel = math.prod(dims)
        if numel > MAX_NUMEL:
            self.fail(path, f"shape {dims} has {numel:.3g} elements, more than the {MAX_NUMEL:.3g} allowed")
        return tuple(dims)

    def dtype(self, x, path, allowed=tuple(DTYPE_BYTES)):
        self.string(x, path, 32)
        if x not in allowed:
            self.fail(path, f"unknown dtype '{x}' (known: {', '.join(allowed)})")
        return x

    def free(self, x, path, depth=0):
        """A free-form JSON section: checks depth and sizes, decodes tagged non-finite floats."""
        if depth > MAX_DEPTH:
            self.fail(path, f"nested deeper than {MAX_DEPTH} levels")
        if isinstance(x, str):
            return self.string(x, path, MAX_TEXT)
        if isinstance(x, list):
            self.array(x, path)
            return [self.free(v, f"{path}[{i}]", depth + 1) for i, v in enumerate(x)]
        if isinstance(x, dict):
            if len(x) == 1 and _FLOAT_TAG in x:
                tag = x[_FLOAT_TAG]
                if tag not in ("nan", "inf", "-inf"):
                    self.fail(path, f'"{_FLOAT_TAG}" must be "nan", "inf" or "-inf", got {str(tag)[:20]!r}')
                return float(tag)
            if len(x) > MAX_ITEMS:
                self.fail(path, f"{len(x)} keys is more than the {MAX_ITEMS} allowed")
            out = {}
            for k, v in x.items():
                self.string(k, f"{path} key", MAX_NAME)
                out[k] = self.free(v, f"{path}.{k}", depth + 1)
            return out
        return x  # None, bool, int, float

    # the file ----------------------------------------------------------------------------
    def read(self, strict: bool) -> Program:
        top = self.obj
        if not isinstance(top, dict):
            self.fail("", f"a project file is a JSON object, got {_type_name(top)}")
        fmt = top.get("format")
        if fmt != FORMAT:
            got = "no 'format' key" if "format" not in top else f"format {str(fmt)[:40]!r}"
            self.fail("format", f"not a StitchCUDA program file ({got}; expected '{FORMAT}')")
        ver = top.get("schema_version")
        if isinstance(ver, bool) or not isinstance(ver, int):
            self.fail("schema_version", f"must be an integer, got {_type_name(ver)}")
        if ver > SCHEMA_VERSION:
            self.fail("schema_version", f"the file has schema version {ver}, written by a newer StitchCUDA; "
                                        f"this one reads up to version {SCHEMA_VERSION}")
        if ver < 1:
            self.fail("schema_version", f"{ver} is not a schema version (versions start at 1)")
        self.obj_keys(top, "", _TOP_KEYS)

        p = Program(self.string(top["name"], "name"))
        next_id = self.integer(top["next_id"], "next_id", 0, 1 << 62)

        # values
        values = self.array(top["values"], "values")
        for i, raw in enumerate(values):
            path = f"values[{i}]"
            self.obj_keys(raw, path, _VALUE_KEYS)
            vid = self.ident(raw["id"], f"{path}.id")
            if vid in p.values:
                self.fail(f"{path}.id", f"duplicate value id '{vid}'")
            role_s = self.string(raw["role"], f"{path}.role", 32)
            try:
                role = Role(role_s)
            except ValueError:
                self.fail(f"{path}.role", f"unknown role '{role_s}' (known: {', '.join(r.value for r in Role)})")
            init = raw["init"]
            if init is not None:
                self.typed(init, (dict,), f"{path}.init", "an object or null")
                init = self.free(init, f"{path}.init")
            p.values[vid] = Value(vid, self.string(raw["name"], f"{path}.name"),
                                  self.shape(raw["shape"], f"{path}.shape"),
                                  self.dtype(raw["dtype"], f"{path}.dtype"), role,
                                  self.ident(raw["producer"], f"{path}.producer", nullable=True), init)
        value_index = {vid: i for i, vid in enumerate(p.values)}

        # nodes
        nodes = self.array(top["nodes"], "nodes")
        produced: dict[str, str] = {}
        for i, raw in enumerate(nodes):
            path = f"nodes[{i}]"
            self.obj_keys(raw, path, _NODE_KEYS)
            nid = self.ident(raw["id"], f"{path}.id")
            if nid in p.nodes:
                self.fail(f"{path}.id", f"duplicate node id '{nid}'")
            if nid in p.values:
                self.fail(f"{path}.id", f"'{nid}' is already the id of a value")
            op_name = self.string(raw["op"], f"{path}.op", 200)
            if op_name not in REGISTRY:
                try:
                    get_op(op_name)
                except ProgramError as e:
                    self.fail(f"{path}.op", str(e))
                self.fail(f"{path}.op", f"'{op_name}' is an alias; files hold canonical op names")
            opdef = REGISTRY[op_name]
            ins = self.array(raw["inputs"], f"{path}.inputs", 100_000)
            for k, vid in enumerate(ins):
                self.ident(vid, f"{path}.inputs[{k}]", nullable=True)
                if vid is not None and vid not in p.values:
                    self.fail(f"{path}.inputs[{k}]", f"refers to unknown value '{vid}'")
            outs = self.array(raw["outputs"], f"{path}.outputs", 1000)
            for k, vid in enumerate(outs):
                self.ident(vid, f"{path}.outputs[{k}]")
                if vid not in p.values:
                    self.fail(f"{path}.outputs[{k}]", f"refers to unknown value '{vid}'")
                if vid in produced:
                    self.fail(f"{path}.outputs[{k}]", f"value '{vid}' is already produced by node '{produced[vid]}'")
                if p.values[vid].producer != nid:
                    self.fail(f"{path}.outputs[{k}]", f"value '{vid}' names producer "
                                                      f"'{p.values[vid].producer}', not '{nid}'")
                produced[vid] = nid
            attrs = self.free(self.typed(raw["attrs"], (dict,), f"{path}.attrs", "an object"), f"{path}.attrs")
            try:
                attrs = opdef.normalize_attrs(attrs)
            except ProgramError as e:
                self.fail(f"{path}.attrs", str(e))
            pos = raw["pos"]
            if pos is not None:
                self.array(pos, f"{path}.pos", 2)
                if len(pos) != 2 or not all(isinstance(c, (int, float)) and not isinstance(c, bool)
                                            and math.isfinite(c) for c in pos):
                    self.fail(f"{path}.pos", "must be [x, y] with two finite numbers, or null")
                pos = (float(pos[0]), float(pos[1]))
            p.nodes[nid] = Node(nid, op_name, list(ins), list(outs), attrs,
                                self.string(raw["name"], f"{path}.name"), pos)

        # producers must agree with the nodes, and source roles have none
        for vid, v in p.values.items():
            path = f"values[{value_index[vid]}]"
            if v.role in SOURCE_ROLES and v.producer is not None:
                self.fail(f"{path}.producer", f"{_a(v.role.value)} has no producer, got '{v.producer}'")
            if v.role not in SOURCE_ROLES and v.producer is None:
                self.fail(f"{path}.producer", f"{_a(v.role.value)} value needs the node that produces it")
            if v.producer is not None and v.producer not in p.nodes:
                self.fail(f"{path}.producer", f"refers to unknown node '{v.producer}'")
            if v.producer is not None and produced.get(vid) != v.producer:
                self.fail(f"{path}.producer", f"node '{v.producer}' does not list '{vid}' among its outputs")

        # program inputs and outputs
        for key in ("inputs", "outputs"):
            lst = self.array(top[key], key)
            seen = set()
            for k, vid in enumerate(lst):
                self.ident(vid, f"{key}[{k}]")
                if vid not in p.values:
                    self.fail(f"{key}[{k}]", f"refers to unknown value '{vid}'")
                if vid in seen:
                    self.fail(f"{key}[{k}]", f"'{vid}' is listed twice")
                seen.add(vid)
                role = p.values[vid].role
                if key == "inputs" and role != Role.INPUT:
                    self.fail(f"{key}[{k}]", f"'{vid}' is {_a(role.value)}, not an input")
                if key == "outputs" and role in (Role.PARAMETER, Role.CONSTANT):
                    self.fail(f"{key}[{k}]", f"'{vid}' is {_a(role.value)}; only computed values can be outputs")
            setattr(p, key, list(lst))
        missing = [vid for vid, v in p.values.items() if v.role == Role.INPUT and vid not in p.inputs]
        if missing:
            self.fail("inputs", f"input value '{missing[0]}' is not listed in the program's inputs")

        self.read_parameters(top["parameters"], p)

        # free-form sections
        regions = self.array(top["regions"], "regions")
        p.regions = [self.region(self.free(r, f"regions[{i}]"), f"regions[{i}]", p) for i, r in enumerate(regions)]
        p.log = self.free(self.array(top["log"], "log"), "log")
        prof = top["profile"]
        if prof is not None:
            self.typed(prof, (dict,), "profile", "an object or null")
        p.profile = self.free(prof, "profile")
        p.metadata = self.free(self.typed(top["metadata"], (dict,), "metadata", "an object"), "metadata")

        p._next_id = next_id
        for ident in list(p.nodes) + list(p.values):
            p._claim_id(ident)  # a stale counter must never hand out an id that is taken
        p._next_id = max(p._next_id, next_id)
        if p._next_id != next_id:
            self.fail("next_id", f"{next_id} is below an id already in use (ids up to {p._next_id})")

        self.check_program(p, strict)
        return p

    def read_parameters(self, params, p: Program) -> None:
        self.array(params, "parameters")
        sidecar_entries = []
        for i, raw in enumerate(params):
            path = f"parameters[{i}]"
            self.typed(raw, (dict,), path, "an object")
            has_data = "data" in raw
            keys = ("value", "dtype", "shape") + (("data",) if has_data else ("sidecar", "sha256"))
            if not has_data and "sidecar" not in raw:
                self.fail(path, "missing key 'data' (inline) or 'sidecar'")
            self.obj_keys(raw, path, keys)
            vid = self.ident(raw["value"], f"{path}.value")
            v = p.values.get(vid)
            if v is None:
                self.fail(f"{path}.value", f"refers to unknown value '{vid}'")
            if v.role not in (Role.PARAMETER, Role.CONSTANT):
                self.fail(f"{path}.value", f"'{vid}' is {_a(v.role.value)}; only parameters and constants hold data")
            if vid in p.data or any(e[1] == vid for e in sidecar_entries):
                self.fail(f"{path}.value", f"'{vid}' has data twice")
            dtype = self.dtype(raw["dtype"], f"{path}.dtype", DATA_DTYPES)
            shape = self.shape(raw["shape"], f"{path}.shape")
            if shape != v.shape:
                self.fail(f"{path}.shape", f"{list(shape)} does not match value '{vid}' of shape {list(v.shape)}")
            nbytes = math.prod(shape) * np.dtype(dtype).itemsize
            if has_data:
                b64 = self.string(raw["data"], f"{path}.data", MAX_FILE_BYTES)
                want = 4 * ((nbytes + 2) // 3)
                if len(b64) != want:
                    self.fail(f"{path}.data", f"{len(b64)} base64 characters, expected {want} for "
                                              f"{dtype}{list(shape)} ({nbytes} bytes)")
                try:
                    blob = base64.b64decode(b64, validate=True)
                except ValueError:
                    self.fail(f"{path}.data", "is not valid base64")
                if len(blob) != nbytes:
                    self.fail(f"{path}.data", f"decodes to {len(blob)} bytes, expected {nbytes}")
                arr = np.frombuffer(blob, dtype=np.dtype(dtype).newbyteorder("<")).reshape(shape)
                p.data[vid] = arr.astype(np.dtype(dtype), copy=True)
            else:
                name = self.string(raw["sidecar"], f"{path}.sidecar", 255)
                if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
                    self.fail(f"{path}.sidecar", f"'{name}' must be a plain file name next to the project file")
                digest = self.string(raw["sha256"], f"{path}.sha256", 64)
                if not re.fullmatch(r"[0-9a-f]{64}", digest):
                    self.fail(f"{path}.sha256", "must be 64 lowercase hex digits")
                sidecar_entries.append((path, vid, dtype, shape, name, digest))
                p.data[vid] = None  # placeholder keeps the file's order; filled below
        if sidecar_entries:
            names = {e[4] for e in sidecar_entries}
            if len(names) > 1:
                self.fail("parameters", f"data is split over several sidecar files ({', '.join(sorted(names))})")
            if self.base_dir is None:
                self.fail(sidecar_entries[0][0] + ".sidecar",
                          f"the data lies in a sidecar file '{names.pop()}', which text alone cannot carry")
            arrays = _read_sidecar(os.path.join(self.base_dir, names.pop()),
                                   [{"value": e[1], "dtype": e[2], "shape": list(e[3]), "sha256": e[5],
                                     "path": e[0]} for e in sidecar_entries], checksums=self.checksums)
            p.data.update(arrays)

    def region(self, d, path, p: Program):
        try:
            from . import regions as regions_mod  # the planner's module; optional until it lands
        except ModuleNotFoundError as e:
            if e.name != __package__ + ".regions":
                raise
            return d
        if not isinstance(d, dict):
            self.fail(path, f"a region must be an object, got {_type_name(d)}")
        try:
            r = regions_mod.Region.from_dict(d)
        except FileFormatError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError, ProgramError) as e:
            msg = f"missing key {e}" if isinstance(e, KeyError) else str(e)
            self.fail(path, f"not a valid region: {msg}")
        return r

    def check_program(self, p: Program, strict: bool) -> None:
        # validate() infers every node it can (setting node.error, the editor's badge) and leaves the
        # recorded shapes as saved; a node it stops at early gets the diagnostic as its error
        for d in p.validate():
            if d.severity != "error":
                continue
            if d.node_id in p.nodes and p.nodes[d.node_id].error is None:
                p.nodes[d.node_id].error = d.message
            if d.code == "cycle":
                self.fail("nodes", d.message)
            if strict:
                self.fail(f"nodes.{d.node_id}" if d.node_id else "", d.message)
        if p.regions and not all(isinstance(r, dict) for r in p.regions):
            self.check_regions(p, strict)

    def check_regions(self, p: Program, strict: bool) -> None:
        """Regions must name existing nodes, not overlap, and form no cycle. Editing the graph after
        planning (deleting a region's node, adding an edge) can break that, so a non-strict load keeps
        the user's program and drops the regions that no longer fit, saying so in the decision log;
        strict=True raises instead."""
        from .regions import check_program_regions
        if not check_program_regions(p):
            return
        regions, p.regions = p.regions, []
        for i, r in enumerate(regions):
            unknown = [(k, n) for k, n in enumerate(r.nodes) if n not in p.nodes]
            if unknown:
                problem = f"refers to unknown node '{unknown[0][1]}'"
                where = f"regions[{i}].nodes[{unknown[0][0]}]"
            else:
                p.regions.append(r)
                found = check_program_regions(p)
                if not found:
                    continue
                p.regions.pop()
                problem, where = found[0], f"regions[{i}]"
            if strict:
                self.fail(where, problem)
            p.log.append({"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "actor": "loader",
                          "action": "drop-region", "region": r.id,
                          "message": f"region {r.id} no longer fits the program and was dropped: {problem}"})


_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _open_sidecar(path: str):
    """The sidecar as a binary file object, only if it is a regular file at exactly `path`: a link is
    never followed (its target may lie anywhere) and a FIFO or device is never opened (it could hang
    the load or read forever). `path` is the project file's real folder plus a plain name, so the file
    opened always lies in that folder."""
    label = os.path.basename(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise FileFormatError(f"sidecar file '{label}' with the large parameters is missing") from None
    if stat.S_ISLNK(st.st_mode):
        try:
            target = f" to '{os.readlink(path)[:200]}'"
        except OSError:
            target = ""
        raise FileFormatError(f"sidecar '{label}' is a symbolic link{target}; a sidecar must be a regular "
                              f"file in the project file's folder, so it is not followed")
    _require_regular(st.st_mode, label)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:  # replaced by a link since the lstat, or unreadable
        raise FileFormatError(f"sidecar '{label}' cannot be opened ({e.strerror or e})") from None
    f = open(fd, "rb")
    try:
        _require_regular(os.fstat(fd).st_mode, label)
    except BaseException:
        f.close()
        raise
    return f


def _require_regular(mode: int, label: str) -> None:
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _KINDS if test(mode)), "not a file")
        raise FileFormatError(f"sidecar '{label}' is {kind}, not a regular file; refusing to read it")


def _npy_header(m, where: str, value: str):
    """(shape, fortran order, dtype) of one member's .npy header. numpy parses the header's text
    with its own literal evaluator, which a damaged header makes raise SyntaxError or TokenError
    rather than ValueError: each is a damaged sidecar."""
    version = np.lib.format.read_magic(m)
    readers = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
    if version not in readers:
        raise FileFormatError(f"{where}: sidecar array '{value}' has .npy version {version}")
    try:
        return readers[version](m)
    except (ValueError, SyntaxError, tokenize.TokenError, TypeError, KeyError) as e:
        raise FileFormatError(f"{where}: sidecar array '{value}' has a damaged .npy header "
                              f"({type(e).__name__})") from None


def _read_into(m, buf: memoryview) -> int:
    """Fill buf from the stream m; the bytes read (fewer at its end)."""
    done = 0
    while done < len(buf):
        n = m.readinto(buf[done:])
        if not n:
            break
        done += n
    return done


_LOCAL_HEADER = struct.Struct("<4s5H3I2H")    # a zip member's local header (the ZIP spec, 4.3.7)


def _read_stored(raw, info: zipfile.ZipInfo, skip: int, buf: memoryview, label: str) -> tuple[int, int]:
    """(bytes read, 1 if any are left over else 0) of an uncompressed member's data after its first `skip` bytes
    (the .npy header), read from the file straight into buf: zipfile's reader copies every chunk twice
    and checks the CRC in Python, a third of the speed of the disk for a model's gigabytes (33_VanillaRNN's
    2.7 GB took 16 s to load). The member's CRC-32 is still checked, over the bytes as read."""
    raw.seek(info.header_offset)
    head = raw.read(_LOCAL_HEADER.size)
    if len(head) != _LOCAL_HEADER.size or head[:4] != b"PK\x03\x04":
        raise FileFormatError(f"sidecar file '{label}' is damaged: a member's local header is missing")
    *_, name_len, extra_len = _LOCAL_HEADER.unpack(head)
    start = info.header_offset + _LOCAL_HEADER.size + name_len + extra_len
    raw.seek(start)
    crc = zlib.crc32(raw.read(skip))
    got = _read_into(raw, buf[:max(0, min(len(buf), info.file_size - skip))])
    crc = zlib.crc32(buf[:got], crc)
    left = info.file_size - skip - got
    if left == 0 and crc != info.CRC:
        raise FileFormatError(f"sidecar file '{label}' is damaged: Bad CRC-32 for file '{info.filename}'")
    return got, 1 if left > 0 else 0


def _read_sidecar(path: str, want: list[dict], *, check_only: bool = False,
                  checksums: bool = True) -> dict[str, np.ndarray]:
    """Read and check the arrays `want` describes from a sidecar .npz, without pickle (their sha256
    too unless checksums=False)."""
    label = os.path.basename(path)
    out = {}
    try:
        with _open_sidecar(path) as raw, zipfile.ZipFile(raw) as z:
            members = {i.filename: i for i in z.infolist()}
            for w in want:
                where = w.get("path", "parameters")
                info = members.get(_member(w))
                if info is None:
                    raise FileFormatError(f"{where}: sidecar '{label}' has no array for '{w['value']}'")
                dtype, shape = np.dtype(w["dtype"]), tuple(w["shape"])
                nbytes = math.prod(shape) * dtype.itemsize
                if info.file_size > nbytes + 4096:  # the .npy header is small; more is not this array
                    raise FileFormatError(f"{where}: sidecar array '{w['value']}' is {info.file_size} bytes, "
                                          f"expected about {nbytes}")
                with z.open(info) as m:
                    hshape, fortran, hdtype = _npy_header(m, where, w["value"])
                    if hdtype.hasobject:
                        raise FileFormatError(f"{where}: sidecar array '{w['value']}' holds Python objects; "
                                              f"refusing to load it")
                    if tuple(hshape) != shape or hdtype.newbyteorder("=") != dtype.newbyteorder("=") \
                            or hdtype.byteorder == ">":
                        raise FileFormatError(f"{where}: sidecar array '{w['value']}' is {hdtype}{list(hshape)}, "
                                              f"the file says {w['dtype']}{list(shape)}")
                    if fortran:
                        raise FileFormatError(f"{where}: sidecar array '{w['value']}' is in Fortran order")
                    arr = np.empty(shape, dtype=dtype.newbyteorder("<"))   # read straight into it: no copies
                    buf = memoryview(arr.reshape(-1)).cast("B")
                    if info.compress_type == zipfile.ZIP_STORED:
                        got, extra = _read_stored(raw, info, m.tell(), buf, label)
                    else:
                        got = _read_into(m, buf) if nbytes else 0
                        extra = len(m.read(1))
                if got != nbytes or extra:
                    raise FileFormatError(f"{where}: sidecar array '{w['value']}' has {got + extra} bytes of "
                                          f"data{' or more' if extra else ''}, expected {nbytes}")
                if checksums and hashlib.sha256(memoryview(arr.reshape(-1)).cast("B")).hexdigest() != w["sha256"]:
                    raise FileFormatError(f"{where}: sidecar array '{w['value']}' does not match the file's "
                                          f"checksum (the sidecar belongs to another save)")
                if not check_only:
                    out[w["value"]] = arr.astype(dtype, copy=False)
    except FileFormatError:
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, ValueError, OSError, NotImplementedError) as e:
        raise FileFormatError(f"sidecar file '{label}' is damaged: {e}") from None
    return out
