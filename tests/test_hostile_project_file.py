"""Hostile and unlucky cases of the project file: saves killed with SIGKILL, the temporary files they
leave, sidecars that are links, FIFOs or folders, damaged files on disk, and programs whose tensors
cannot fit this machine (docs/PROJECT_FILE.md, docs/SECURITY.md)."""
from __future__ import annotations

import fcntl
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from agent_core import memory_check
from agent_core import project_file as pf
from agent_core.errors import FileFormatError
from agent_core.ir import Program
from agent_core.project_file import load_program, program_to_json, save_program
from tests.hostile import snapshot, unchanged

BIG = (4096, 1024)  # 16 MiB of float32: a save takes long enough to be killed in the middle


def versioned(k: int, shape=BIG) -> Program:
    """Version k of one program: its name and every element of its parameter say which it is."""
    p = Program(f"v{k}")
    x = p.add_input("x", shape)
    w = p.add_parameter("w", (np.arange(np.prod(shape), dtype=np.float32) % 1000 + k * 1000).reshape(shape))
    p.mark_output(p.add_node("add", [x.id, w.id]).outputs[0])
    return p


def version_of(p: Program) -> int:
    k = int(p.name[1:])
    w = next(iter(p.data.values()))
    assert np.array_equal(w, next(iter(versioned(k, w.shape).data.values()))), f"{p.name}: data of another version"
    return k


def tmp_files(folder) -> list[str]:
    return sorted(n for n in os.listdir(folder) if n.endswith(pf.TMP_SUFFIX))


def wait_out_the_grace(folder) -> None:
    """Orphans younger than ORPHAN_GRACE_S are left on purpose (docs/PROJECT_FILE.md)."""
    times = [os.lstat(os.path.join(folder, n)).st_mtime for n in tmp_files(folder)]
    if times:
        time.sleep(max(0.0, pf.ORPHAN_GRACE_S - (time.time() - max(times))) + 0.05)


# --- saves killed with SIGKILL ---------------------------------------------------------------
def forked_save(program: Program, path) -> tuple[int, int, int]:
    """A child process (forked: no second torch start-up) that saves `program` to `path` once it
    reads a byte from the returned pipe, and writes how long the save took to the same pipe."""
    go_r, go_w = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: numpy, zipfile and the file system only; it never returns into pytest
        code = 1
        try:
            os.read(go_r, 1)
            t0 = time.perf_counter()
            save_program(program, path)
            os.write(done_w, repr(time.perf_counter() - t0).encode())
            code = 0
        finally:
            os._exit(code)
    for fd in (go_r, done_w):
        os.close(fd)
    return pid, go_w, done_r


def test_a_save_killed_at_random_points_leaves_a_loadable_file_and_the_next_save_no_orphan(tmp_path):
    folder = tmp_path / "project"
    folder.mkdir()
    path = folder / "prog.json"
    save_program(versioned(0), path)
    # one child measures how long a save takes; then five are SIGKILLed at uniform points of that time
    pid, go, done = forked_save(versioned(1), path)
    os.write(go, b"g")
    duration = float(os.read(done, 100))
    assert os.waitpid(pid, 0)[1] == 0 and version_of(load_program(path)) == 1
    on_disk, seen_orphans, rng = 1, 0, random.Random()
    # at least five trials, and more (up to 25) until one kill has landed mid-save: on a loaded machine
    # a fork's start-up time varies, so a kill drawn over the measured save can miss it several times
    for k in range(2, 27):
        if k > 6 and seen_orphans:
            break
        delay = rng.uniform(0, duration)
        where = f"trial {k - 1}: killed {delay:.3f} s into a {duration:.3f} s save"
        pid, go, done = forked_save(versioned(k), path)
        os.write(go, b"g")
        time.sleep(delay)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(go)
        os.close(done)
        seen_orphans += bool(tmp_files(folder))
        wait_out_the_grace(folder)
        # opening the killed save's folder: it loads, old or new, and the open removes its orphans
        opened = tmp_path / f"opened{k}"
        shutil.copytree(folder, opened, symlinks=True)
        assert version_of(load_program(opened / "prog.json")) in (on_disk, k), where
        assert tmp_files(opened) == [], where
        shutil.rmtree(opened)
        # the next save removes them too, and leaves nothing but the pair behind
        on_disk = 100 + k
        save_program(versioned(on_disk), path)
        assert sorted(os.listdir(folder)) == ["prog.json", "prog.json.npz"], where
        assert version_of(load_program(path)) == on_disk, where
    assert seen_orphans, f"no kill landed while a temporary file existed ({duration:.3f} s saves)"


# --- orphan cleanup touches only our own files -----------------------------------------------
def test_only_our_unlocked_orphans_of_that_file_are_removed(tmp_path):
    folder = tmp_path / "project"
    folder.mkdir()
    path = folder / "prog.json"
    save_program(versioned(0, (64, 80)), path)
    outside = tmp_path / "outside.txt"
    outside.write_text("not ours")
    old = time.time() - 60

    def make(name, text="partial save"):
        (folder / name).write_text(text)
        os.utime(folder / name, (old, old))
    orphans = [".prog.json.abcd1234.stitchcuda-tmp", ".prog.json.npz.x_y_z_0a.stitchcuda-tmp"]
    for name in orphans:
        make(name)
    kept = [".other.json.abcd1234.stitchcuda-tmp",  # another project's
            ".prog.json.abcd1234.tmp",  # not our suffix
            "prog.json.abcd1234.stitchcuda-tmp",  # no leading dot
            ".prog.json.abc.stitchcuda-tmp",  # not 8 random characters
            ".prog.json.abcd1234.stitchcuda-tmp.bak", "notes.txt"]
    for name in kept:
        make(name)
    (folder / ".prog.json.linklink.stitchcuda-tmp").symlink_to(outside)  # a link: never ours
    (folder / ".prog.json.folder12.stitchcuda-tmp").mkdir()  # a folder: never ours
    (folder / ".prog.json.young123.stitchcuda-tmp").write_text("a save that just began")
    make(".prog.json.locked12.stitchcuda-tmp")
    before = snapshot(folder)
    with open(folder / ".prog.json.locked12.stitchcuda-tmp", "rb") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)  # a live save in another process holds its file
        with pytest.raises(FileFormatError):  # opening a bad file changes nothing, orphans included
            load_program(folder / "notes.txt")
        assert snapshot(folder) == before
        with unchanged(tmp_path, ignore=[f"project/{n}" for n in ["prog.json", "prog.json.npz", *orphans]]):
            save_program(versioned(1, (64, 80)), path)
    assert not any((folder / n).exists() for n in orphans)
    assert version_of(load_program(path)) == 1
    assert outside.read_text() == "not ours"

    # an open removes them as well (the grace and the lock are released now)
    make(orphans[0])
    make(".prog.json.young123.stitchcuda-tmp")
    with unchanged(folder, ignore=[orphans[0], ".prog.json.locked12.stitchcuda-tmp",
                                   ".prog.json.young123.stitchcuda-tmp"]):
        load_program(path)
    assert tmp_files(folder) == sorted([".other.json.abcd1234.stitchcuda-tmp", ".prog.json.abc.stitchcuda-tmp",
                                        ".prog.json.folder12.stitchcuda-tmp", ".prog.json.linklink.stitchcuda-tmp",
                                        "prog.json.abcd1234.stitchcuda-tmp"])


# --- sidecars that are links, FIFOs, devices or folders --------------------------------------
@pytest.fixture
def project(tmp_path):
    """A saved program with a sidecar in tmp_path/project, and a valid copy of its sidecar outside."""
    folder = tmp_path / "project"
    folder.mkdir()
    save_program(versioned(3, (64, 80)), folder / "prog.json")
    shutil.copy(folder / "prog.json.npz", tmp_path / "elsewhere.npz")
    (folder / "prog.json.npz").unlink()
    return folder


@pytest.mark.parametrize("make, says", [
    (lambda side, tmp: side.symlink_to(tmp / "elsewhere.npz"), "is a symbolic link to '"),  # outside, valid
    (lambda side, tmp: side.symlink_to("/dev/zero"), "is a symbolic link to '/dev/zero'"),
    (lambda side, tmp: side.symlink_to("../project/prog.json.npz"), "is a symbolic link"),  # to itself
    (lambda side, tmp: os.mkfifo(side), "is a FIFO, not a regular file"),
    (lambda side, tmp: side.mkdir(), "is a folder, not a regular file"),
], ids=["outside", "dev-zero", "loop", "fifo", "folder"])
def test_a_sidecar_that_is_not_a_regular_file_in_the_folder_is_refused(project, make, says):
    make(project / "prog.json.npz", project.parent)
    with unchanged(project.parent):
        with pytest.raises(FileFormatError) as e:
            load_program(project / "prog.json")
    msg = str(e.value)
    assert msg.startswith(f"{project / 'prog.json'}: sidecar 'prog.json.npz' ") and says in msg and "\n" not in msg


def test_saving_replaces_a_sidecar_link_and_never_writes_through_it(project):
    elsewhere = project.parent / "elsewhere.npz"
    (project / "prog.json.npz").symlink_to(elsewhere)
    with unchanged(project.parent, ignore=["project/prog.json", "project/prog.json.npz"]):
        save_program(versioned(4, (64, 80)), project / "prog.json")
    assert not (project / "prog.json.npz").is_symlink() and (project / "prog.json.npz").is_file()
    assert version_of(load_program(project / "prog.json")) == 4

    # without large parameters there is no sidecar to write: a link at its name is not ours to remove
    (project / "prog.json.npz").unlink()
    (project / "prog.json.npz").symlink_to(elsewhere)
    with unchanged(project.parent, ignore=["project/prog.json"]):
        save_program(versioned(5, (4, 8)), project / "prog.json")
    assert (project / "prog.json.npz").is_symlink() and version_of(load_program(project / "prog.json")) == 5


def test_a_project_file_reached_through_a_link_reads_the_sidecar_beside_its_target(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    save_program(versioned(6, (64, 80)), tmp_path / "a" / "prog.json")
    (tmp_path / "b" / "link.json").symlink_to(tmp_path / "a" / "prog.json")
    with unchanged(tmp_path, ignore=["a/prog.json", "a/prog.json.npz"]):
        assert version_of(load_program(tmp_path / "b" / "link.json")) == 6
        save_program(versioned(7, (64, 80)), tmp_path / "b" / "link.json")  # updates the target's pair
    assert sorted(os.listdir(tmp_path / "a")) == ["prog.json", "prog.json.npz"]
    assert version_of(load_program(tmp_path / "a" / "prog.json")) == 7


# --- damaged files on disk --------------------------------------------------------------------
class _Pair(tuple):
    def __repr__(self):  # hypothesis prints the arguments of a failing case: not 20 kB of bytes
        return "saved_pair"


@pytest.fixture(scope="module")
def saved_pair(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pair")
    p = versioned(8, (64, 80))
    save_program(p, folder / "prog.json")
    return _Pair(((folder / "prog.json").read_bytes(), (folder / "prog.json.npz").read_bytes(), program_to_json(p)))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_truncated_or_flipped_files_on_disk_give_a_clean_error_or_the_saved_program(tmp_path, saved_pair, data):
    """A truncation of either file, or flipped bits of the sidecar (the JSON's own bit flips are in
    test_project_file.py), is a FileFormatError of one line; a flip that lands in a byte the zip
    format ignores loads the saved program exactly. A failed load changes nothing on disk."""
    text, npz, want = saved_pair
    which = data.draw(st.sampled_from(["json", "npz"]))
    blob = bytearray(text if which == "json" else npz)
    if which == "json" or data.draw(st.booleans()):
        end = len(text.rstrip()) if which == "json" else len(blob)  # a JSON cut after its "}" is whole
        blob = blob[:data.draw(st.integers(0, end - 1))]
    else:
        for i in data.draw(st.lists(st.integers(0, len(blob) - 1), min_size=1, max_size=4)):
            blob[i] ^= 1 << data.draw(st.integers(0, 7))
    folder = tmp_path / f"case{data.draw(st.integers(0, 10 ** 9))}"
    folder.mkdir()
    (folder / "prog.json").write_bytes(bytes(blob) if which == "json" else text)
    (folder / "prog.json.npz").write_bytes(bytes(blob) if which == "npz" else npz)
    try:
        with unchanged(folder):
            got = load_program(folder / "prog.json")
    except FileFormatError as e:
        assert "\n" not in str(e) and str(e).startswith(str(folder / "prog.json"))
    else:
        assert which == "npz" and program_to_json(got) == want
    finally:
        shutil.rmtree(folder)


# --- programs whose tensors cannot fit --------------------------------------------------------
def huge_program() -> dict:
    """10^12 elements in and out: loads (shapes up to 2^40 elements are allowed), fits nowhere."""
    p = Program("huge")
    x = p.add_input("x", (1000000, 1000000))
    p.mark_output(p.add_node("relu", [x.id]).outputs[0])
    return program_to_json(p)


@pytest.fixture(scope="module")
def huge(tmp_path_factory):
    folder = tmp_path_factory.mktemp("huge")
    (folder / "big.json").write_text(json.dumps(huge_program()))
    return folder


def _cli(folder, *args):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # runs from the folder, not the repo
    return subprocess.run([sys.executable, "-m", "agent_core.cli", *args], cwd=folder, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": root})


_NEEDS = "the program needs 14.6 TiB for its tensors (largest: v1 'x' float32[1000000, 1000000], 3.6 TiB), " \
         "this machine has "


@pytest.mark.parametrize("command", [["run", "big.json", "--device", "cpu"], ["export", "big.json", "-o", "out"]])
def test_run_and_export_refuse_a_program_too_large_for_this_machine(huge, command):
    with unchanged(huge):
        r = _cli(huge, *command)
    assert r.returncode == 1, r.stderr
    line = r.stderr.strip()
    assert "\n" not in line and "internal error" not in line and _NEEDS in line and "of memory free" in line
    assert line.startswith(f"stitchcuda {command[0]}: error: ") and ("big.json: " in line or "program 'huge': " in line)


def test_plan_of_a_program_too_large_to_check_plans_it_unrewritten_and_says_why(huge):
    with unchanged(huge):
        r = _cli(huge, "plan", "big.json")
    assert r.returncode == 0, r.stderr
    # checking the rewrites holds two draws: twice the input and output, and one float64 draw buffer
    assert r.stderr.strip().startswith("stitchcuda plan: big.json: rewrites skipped: the program needs 21.8 TiB "
                                       "for its tensors (2 draws of its inputs and values at once; largest: v1 "
                                       "'x' float32[1000000, 1000000], 3.6 TiB), this machine has ")
    assert "\n" not in r.stderr.strip()
    assert "1 node -> 1 region," in r.stdout and "estimate on a CUDA graph: unfused " in r.stdout


def test_the_size_check_counts_inputs_drawn_parameters_every_computed_value_and_one_draw_buffer(monkeypatch):
    """The bound of docs/PROJECT_FILE.md, to the byte: a program needing N bytes runs with N free and
    is refused with N - 1 free."""
    p = Program("counted")
    x = p.add_input("x", (100, 10))                                         # 4000 B, drawn
    w = p.add_parameter("w", np.ones((10, 10), np.float32))                 # stored: already in memory
    b = p.add_parameter("b", shape=(100, 10), dtype="float32")              # drawn: 4000 B
    h = p.add_node("matmul", [x.id, w.id])                                  # 4000 B
    p.mark_output(p.add_node("add", [h.outputs[0], b.id]).outputs[0])      # 4000 B
    need = 4000 * 4 + 1000 * 8  # + one float64 buffer of the largest drawn tensor
    from agent_core.reference import random_inputs
    monkeypatch.setattr(memory_check, "host_available", lambda: need)
    random_inputs(p)
    monkeypatch.setattr(memory_check, "host_available", lambda: need - 1)
    with pytest.raises(memory_check.DoesNotFit, match=r"program 'counted': the program needs 23\.4 KiB .*"
                                                      r"this machine has 23\.4 KiB of memory free"):
        random_inputs(p)
    monkeypatch.setattr(memory_check, "host_available", lambda: None)  # unknown: not refused
    random_inputs(p)


def test_the_rewrite_check_needs_room_for_every_draw_it_holds(monkeypatch):
    """The check keeps all values of each of its draws (rewrites.engine.CHECK_DRAWS): inputs and computed
    values count once per draw, parameters once; a program that fits one run but not two is refused
    before the check allocates (48_Mamba2ReturnY's check was killed by the kernel's OOM killer)."""
    from agent_core.rewrites.engine import CHECK_DRAWS
    p = Program("drawn_twice")
    x = p.add_input("x", (100, 10))                                         # 4000 B per draw
    b = p.add_parameter("b", shape=(100, 10), dtype="float32")              # 4000 B, shared
    p.mark_output(p.add_node("add", [x.id, b.id]).outputs[0])               # 4000 B per draw
    need = 4000 + CHECK_DRAWS * 8000 + 1000 * 8                             # + the float64 draw buffer
    monkeypatch.setattr(memory_check, "host_available", lambda: need)
    memory_check.require_fits(p, runs=CHECK_DRAWS)
    memory_check.require_fits(p)                                            # one run: 8000 B less
    monkeypatch.setattr(memory_check, "host_available", lambda: need - 1)
    with pytest.raises(memory_check.DoesNotFit):
        memory_check.require_fits(p, runs=CHECK_DRAWS)
    memory_check.require_fits(p)


@pytest.mark.gpu
def test_a_program_too_large_for_the_gpu_is_refused_naming_the_gpu(tmp_path):
    import torch
    free, _ = torch.cuda.mem_get_info()
    side = int((free / 4) ** 0.5) + 1024  # one float32 input just over what the GPU has free
    p = Program("gpu_big")
    x = p.add_input("x", (side, side))
    p.mark_output(p.add_node("relu", [x.id]).outputs[0])
    save_program(p, tmp_path / "big.json")
    with unchanged(tmp_path):
        r = _cli(tmp_path, "run", "big.json", "--device", "cuda")
    assert r.returncode == 1, r.stderr
    assert "big.json: the program needs " in r.stderr and "the GPU (cuda:0, " in r.stderr and " free" in r.stderr


def test_the_size_check_counts_a_convolutions_scratch_on_the_host(monkeypatch):
    """torch's CPU convolutions hold up to twice their output again while they run: a program whose
    values fit but whose convolution's scratch does not is refused before the run (the rewrite check of
    KernelBench's 100_ConvTranspose3d was ended by the OOM killer on a 24 GB machine)."""
    p = Program("conv_scratch")
    x = p.add_input("x", (1, 2, 10))                                        # 80 B, drawn
    w = p.add_parameter("w", np.ones((4, 2, 3), np.float32))                # stored
    p.mark_output(p.add_node("conv1d", [x.id, w.id], {"padding": [1]}).outputs[0])   # [1, 4, 10]: 160 B
    need = 80 + 160 + 2 * 160          # inputs and values, then the scratch (more than the 160 B draw buffer)
    monkeypatch.setattr(memory_check, "host_available", lambda: need)
    memory_check.require_fits(p)
    monkeypatch.setattr(memory_check, "host_available", lambda: need - 1)
    with pytest.raises(memory_check.DoesNotFit):
        memory_check.require_fits(p)
    memory_check.require_fits(p, parts=("inputs",))                         # no convolution runs: no scratch
