"""Build .raybundle/: Ray for CPython 3.12 on manylinux x86_64, small enough to carry to a machine with
no network (the GPU machine has python3.12 and numpy, nothing else of Ray's).

    python tools/ray_bundle.py [--ray-version 2.60.0] [--check /path/to/python3.12]

Downloads the Ray wheel and its dependencies' wheels for that target (pip download, ordinary client),
unpacks them into one site folder, removes what `bench --ray` never loads (the dashboard's web front
end, the Java jars, tune/train/serve/rllib/data/llm/air/workflow, test folders, bytecode), and packs
the rest as .raybundle/ray-site-cp312.tar.xz. It prints the size and the commands that unpack and use
it. With --check it unpacks the archive into a temporary folder and starts a one-CPU cluster there
with that interpreter (PYTHONPATH pointing at the bundle only), running one task.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUNDLE = ROOT / ".raybundle"
ARCHIVE = "ray-site-cp312.tar.xz"
LIMIT = 60 * 2**20

# never imported by ray.init and tasks (the dashboard's Python stays: the raylet starts its agent)
PRUNE = ("ray/dashboard/client", "ray/jars", "ray/tune", "ray/train", "ray/serve", "ray/rllib", "ray/data",
         "ray/llm", "ray/air", "ray/workflow", "ray/cpp", "ray/tests")
PRUNE_NAMES = {"tests", "__pycache__"}

CHECK = """
import ray
ray.init(num_cpus=1, include_dashboard=False)
@ray.remote
def where():
    import socket
    return socket.gethostname()
print("ray", ray.__version__, "from", ray.__file__, "ran a task on", ray.get(where.remote()))
ray.shutdown()
"""


def download(version: str, dest: Path) -> list[Path]:
    cmd = [sys.executable, "-m", "pip", "download", f"ray=={version}", "--dest", str(dest), "--only-binary=:all:",
           "--python-version", "3.12", "--implementation", "cp", "--abi", "cp312",
           "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_17_x86_64",
           "--platform", "manylinux_2_28_x86_64", "-q"]
    subprocess.run(cmd, check=True)
    return sorted(dest.glob("*.whl"))


def unpack(wheels: list[Path], site: Path) -> None:
    for whl in wheels:
        with zipfile.ZipFile(whl) as z:
            z.extractall(site)
    for sub in PRUNE:
        shutil.rmtree(site / sub, ignore_errors=True)
    for p in sorted(site.rglob("*"), key=lambda p: -len(p.parts)):
        if p.is_dir() and p.name in PRUNE_NAMES:
            shutil.rmtree(p, ignore_errors=True)
        elif p.suffix == ".pyc":
            p.unlink()
    for exe in (site / "ray" / "core" / "src").rglob("*"):   # zip extraction drops the executable bits
        if exe.is_file() and exe.suffix not in (".py", ".pyi"):
            exe.chmod(0o755)


def pack(site: Path, out: Path) -> None:
    with tarfile.open(out, "w:xz", preset=6) as tar:
        for p in sorted(site.iterdir()):
            tar.add(p, arcname=p.name)


def check(python: str, archive: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="raybundle-check-") as tmp:
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="tar")
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env["PYTHONPATH"] = tmp
        subprocess.run([python, "-s", "-c", CHECK], env=env, check=True, timeout=300)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ray-version", default="2.60.0")
    ap.add_argument("--check", metavar="PYTHON3.12", help="unpack the archive and start a cluster with this python")
    args = ap.parse_args()
    BUNDLE.mkdir(exist_ok=True)
    out = BUNDLE / ARCHIVE
    with tempfile.TemporaryDirectory(prefix="raybundle-") as tmp:
        wheels = download(args.ray_version, Path(tmp) / "wheels")
        print("wheels: " + ", ".join(w.name for w in wheels))
        unpack(wheels, Path(tmp) / "site")
        pack(Path(tmp) / "site", out)
    size = out.stat().st_size
    print(f"{out.relative_to(ROOT)}: {size / 2**20:.1f} MiB" + ("" if size <= LIMIT else
          f" -- OVER the {LIMIT // 2**20} MiB limit"))
    print("on the target: mkdir -p ~/raysite && tar -xJf ray-site-cp312.tar.xz -C ~/raysite && "
          "export PYTHONPATH=~/raysite:$PYTHONPATH")
    print("  then: python3.12 -m agent_core.cli bench ... --ray local   (the ray CLI: python3.12 -m ray.scripts.scripts)")
    if args.check:
        check(args.check, out)
    return 0 if size <= LIMIT else 1


if __name__ == "__main__":
    sys.exit(main())
