"""`python -m app [FILE] [--screenshot OUT.png] [--theme dark|light]`"""
import argparse
import sys

from .main import run_studio


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m app", description="StitchCUDA Studio, the node-graph editor")
    ap.add_argument("file", nargs="?", metavar="FILE", help="a program (.json) or a KernelBench / PyTorch .py file")
    ap.add_argument("--screenshot", metavar="OUT.png", help="render the window offscreen to a PNG and exit")
    ap.add_argument("--theme", choices=("dark", "light"), default=None,
                    help="default: the theme last chosen in the studio (dark at first)")
    args = ap.parse_args(argv)
    return run_studio(args.file, screenshot=args.screenshot, theme=args.theme)


if __name__ == "__main__":
    sys.exit(main())
