"""Reading what `stitchcuda optimize -o OUTDIR` wrote (program.json, events.jsonl, profile.json) so the
studio can replay a run made elsewhere (a GPU server) exactly as if it had watched it live."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from agent_core.agent.events import BadLine, read_events
from agent_core.errors import FileFormatError


@dataclass
class Results:
    folder: str
    program: object                 # agent_core Program, with its regions (sources, measurements)
    events: list[dict]
    profile: dict
    bad: list[BadLine] = field(default_factory=list)


def read_results(folder: str, need_events: bool = True) -> Results:
    """The run in `folder`; FileFormatError naming what is missing or broken. need_events=False for
    a worker's own output folder (its events came over stdout, not in events.jsonl)."""
    from agent_core.project_file import load_program
    if not os.path.isdir(folder):
        raise FileFormatError(f"{folder}: not a folder (choose the folder stitchcuda optimize -o wrote)")
    prog_path = os.path.join(folder, "program.json")
    ev_path = os.path.join(folder, "events.jsonl")
    missing = [os.path.basename(p) for p in ((prog_path, ev_path) if need_events else (prog_path,))
               if not os.path.isfile(p)]
    if missing:
        raise FileFormatError(f"{folder}: no {' or '.join(missing)} (is this a folder stitchcuda optimize -o wrote?)")
    program = load_program(prog_path)
    bad: list[BadLine] = []
    events = []
    if os.path.isfile(ev_path):
        with open(ev_path, encoding="utf-8") as f:
            events = list(read_events(f, strict=False, bad=bad))
    profile = {}
    prof_path = os.path.join(folder, "profile.json")
    if os.path.isfile(prof_path):
        try:
            with open(prof_path, encoding="utf-8") as f:
                profile = json.load(f)
        except ValueError as e:
            raise FileFormatError(f"{prof_path}: not JSON ({e})") from None
        if not isinstance(profile, dict):
            raise FileFormatError(f"{prof_path}: expected an object, got {type(profile).__name__}")
    return Results(folder, program, events, profile, bad)
