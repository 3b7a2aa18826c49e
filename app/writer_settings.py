"""Settings > Kernel Writer…: the OpenAI-compatible endpoint a model proposes kernels from (issue #18).

What is set here lives in the user's QSettings under writer/ (never in a program file): the server's
base URL, the model, rounds per region, the token caps, and where the API key comes from (none, stored
in these settings, or an environment variable the studio was started with). No URL means the feature
is off. The key reaches the worker only through its environment (docs/WRITER.md): never its argv.

Test Connection asks the server for GET {url}/models on a pool thread; the dialog stays usable.
"""
from __future__ import annotations

import functools
import json
import os
import re
import urllib.error
import urllib.request
from dataclasses import dataclass, field

from PySide6.QtCore import QObject, QRunnable, QSettings, Qt, QThreadPool, Signal
from PySide6.QtWidgets import (QButtonGroup, QComboBox, QDialog, QDialogButtonBox, QFormLayout, QGridLayout,
                               QHBoxLayout, QLabel, QLineEdit, QPushButton, QRadioButton, QSpinBox, QVBoxLayout,
                               QWidget)

from . import settings as stored

GROUP = "writer/"
DEFAULT_KEY_ENV = "STITCHCUDA_WRITER_KEY"   # the variable the worker reads a stored key from
KEY_MODES = ("none", "stored", "env")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
TEST_TIMEOUT_S = 10.0
MAX_MODELS_BYTES = 4 << 20   # a /models answer lists names: a few KiB
NO_ENDPOINT = "Set a model endpoint first: Settings > Kernel Writer…"
# (key, label, lowest, highest, step); the defaults are agent_core.writer.config.WriterConfig's
LIMITS = (("rounds", "Rounds per region", 1, 10, 1),
          ("max_tokens", "Tokens per reply", 256, 131_072, 1024),
          ("region_token_cap", "Tokens per region", 1_000, 10_000_000, 10_000),
          ("run_token_cap", "Tokens per run", 1_000, 100_000_000, 50_000))


@functools.lru_cache(maxsize=1)
def cap_flag(key: str) -> str:
    return "--writer-" + key.replace("_", "-")


def _config_defaults() -> dict:
    from dataclasses import fields

    from agent_core.writer.config import WriterConfig
    return {f.name: f.default for f in fields(WriterConfig)}


@dataclass
class WriterSettings:
    url: str = ""
    model: str = ""
    rounds: int = 3
    max_tokens: int = 8192
    region_token_cap: int = 60_000
    run_token_cap: int = 400_000
    key_mode: str = "none"               # none | stored | env
    key: str = field(default="", repr=False)
    key_env: str = DEFAULT_KEY_ENV       # the variable to read when key_mode is "env"

    @property
    def enabled(self) -> bool:
        return bool(self.url.strip() and self.model.strip())

    def config(self, regions=()):
        """The endpoint as agent_core sees it (validate() says what is wrong with it)."""
        from agent_core.writer.config import WriterConfig
        return WriterConfig(url=self.url.strip(), model=self.model.strip(), rounds=self.rounds,
                            key_env=self.worker_key_env(), max_tokens=self.max_tokens,
                            region_token_cap=self.region_token_cap, run_token_cap=self.run_token_cap,
                            regions=tuple(regions))

    def host(self) -> str:
        return self.config().host()

    def is_remote(self) -> bool:
        return self.config().is_remote()

    def notice(self) -> str:
        """What a user must know before asking: where the region goes, and what never leaves."""
        if not self.url.strip():
            return "No model endpoint is set: the kernel writer is off (Settings > Kernel Writer…)."
        try:
            host, remote = self.host(), self.is_remote()
        except Exception as e:   # a URL validate() refuses: say so instead of guessing its host
            return f"The endpoint URL is not usable: {e}"
        if remote:
            return (f"The region's ops, shapes and our kernel source are sent to {host}; "
                    "weights and data are not.")
        return f"The server is on this machine ({host}): nothing leaves it."

    def worker_key_env(self) -> str:
        return self.key_env if self.key_mode == "env" else DEFAULT_KEY_ENV

    def key_value(self) -> str | None:
        """The key this endpoint is asked with: stored, or read from the studio's environment."""
        if self.key_mode == "stored":
            return self.key or None
        if self.key_mode == "env":
            return os.environ.get(self.key_env) or None
        return None

    def worker_args(self, region_id: str) -> list[str]:
        """The worker's writer flags for one region (the key is not among them: worker_env)."""
        caps = [a for key, *_ in LIMITS[1:] for a in (cap_flag(key), str(getattr(self, key)))]
        return ["--writer", self.url.strip(), "--writer-model", self.model.strip(),
                "--writer-rounds", str(self.rounds), "--writer-regions", region_id,
                "--writer-key-env", self.worker_key_env(), *caps]

    def worker_env(self) -> dict[str, str | None]:
        """Variables to set (or, None, to remove) in the worker's environment: the stored key under
        DEFAULT_KEY_ENV; without a key, no inherited value of it either."""
        if self.key_mode == "stored" and self.key:
            return {DEFAULT_KEY_ENV: self.key}
        if self.key_mode == "env":
            return {}
        return {DEFAULT_KEY_ENV: None}


def load(qs: QSettings) -> tuple[WriterSettings, list[str]]:
    """The stored endpoint; a value of the wrong type is reset to its default, with a notice."""
    base = _config_defaults()
    notes = []
    ws = WriterSettings(**{k: base[k] for k, *_ in LIMITS})

    def keep(value_note):
        value, note = value_note
        if note:
            notes.append(note)
        return value
    ws.url = keep(stored.text(qs, GROUP + "url"))
    ws.model = keep(stored.text(qs, GROUP + "model", max_chars=512))
    for key, _label, lo, hi, _step in LIMITS:
        setattr(ws, key, keep(stored.integer(qs, GROUP + key, getattr(ws, key), lo, hi)))
    mode = keep(stored.text(qs, GROUP + "key_mode", "none", max_chars=16))
    if mode not in KEY_MODES:
        qs.remove(GROUP + "key_mode")
        notes.append(f"Setting 'writer/key_mode' was {mode!r}, not one of {', '.join(KEY_MODES)}; reset to none")
        mode = "none"
    ws.key_mode = mode
    ws.key = keep(stored.text(qs, GROUP + "key", max_chars=4096))
    env = keep(stored.text(qs, GROUP + "key_env", DEFAULT_KEY_ENV, max_chars=128))
    ws.key_env = env if ENV_NAME.fullmatch(env) else DEFAULT_KEY_ENV
    return ws, notes


def save(qs: QSettings, ws: WriterSettings) -> None:
    qs.setValue(GROUP + "url", ws.url.strip())
    qs.setValue(GROUP + "model", ws.model.strip())
    for key, *_ in LIMITS:
        qs.setValue(GROUP + key, int(getattr(ws, key)))
    qs.setValue(GROUP + "key_mode", ws.key_mode)
    qs.setValue(GROUP + "key_env", ws.key_env)
    if ws.key_mode == "stored" and ws.key and ws.url.strip():
        qs.setValue(GROUP + "key", ws.key)
    else:   # a key no longer used (or the writer off) is not kept on disk
        qs.remove(GROUP + "key")
    qs.sync()


# Test Connection ---------------------------------------------------------------------------------
def list_models(url: str, key: str | None, timeout_s: float = TEST_TIMEOUT_S) -> list[str]:
    """The model ids GET {url}/models lists (OpenAI's {"data": [{"id": ...}]}; Ollama's {"models": [...]}
    too). Raises OSError with one line a user reads; the key is never part of it."""
    req = urllib.request.Request(url.rstrip("/") + "/models", headers={"Accept": "application/json"})
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            body = r.read(MAX_MODELS_BYTES + 1)
    except urllib.error.HTTPError as e:
        hint = {401: " (the server wants a valid API key)", 403: " (the key is not allowed here)",
                404: " (no /models here: is the URL the API's base, e.g. ending in /v1?)"}.get(e.code, "")
        raise OSError(f"the server answered HTTP {e.code} {e.reason}{hint}") from None
    except urllib.error.URLError as e:
        raise OSError(f"could not connect ({getattr(e.reason, 'strerror', None) or e.reason})") from None
    except (TimeoutError, OSError) as e:
        raise OSError(f"no answer within {timeout_s:.0f} s ({type(e).__name__})") from None
    if len(body) > MAX_MODELS_BYTES:
        raise OSError("the answer to /models is larger than a list of models can be")
    try:
        doc = json.loads(body.decode("utf-8"))
        items = doc.get("data", doc.get("models")) if isinstance(doc, dict) else None
        ids = [str(m.get("id") or m.get("name")) if isinstance(m, dict) else str(m) for m in items]
    except (ValueError, TypeError, AttributeError):
        raise OSError("the answer to /models is not a list of models (is this an OpenAI-compatible server?)") \
            from None
    return [i for i in ids if i and i != "None"]


class _Relay(QObject):
    done = Signal(int, object)   # the test's number, its list of model ids or its error text


class _TestJob(QRunnable):
    def __init__(self, n: int, url: str, key: str | None, relay: _Relay):
        super().__init__()
        self.n, self.url, self.key, self.relay = n, url, key, relay

    def run(self):
        try:
            result = list_models(self.url, self.key)
        except OSError as e:
            result = str(e)
        except Exception as e:   # a bug here must not reach the pool thread's top
            result = f"{type(e).__name__}: {e}"
        self.relay.done.emit(self.n, result)


# the dialog ---------------------------------------------------------------------------------------
class WriterSettingsDialog(QDialog):
    """The endpoint's fields; Save stores them (saved(settings) after), Cancel leaves them."""
    saved = Signal(object)            # the WriterSettings just stored
    tested = Signal(bool, str)        # a connection test ended: ok, what the dialog says about it

    def __init__(self, qs: QSettings, parent=None):
        super().__init__(parent)
        self.qs = qs
        self.setWindowTitle("Kernel Writer")
        self.setMinimumWidth(560)
        current, notes = load(qs)
        lay = QVBoxLayout(self)
        intro = QLabel("A model served by an OpenAI-compatible endpoint (vLLM, SGLang, Ollama, llama.cpp's server, "
                       "a hosted API) proposes CUDA for a region. A proposal is kept only if it passes every check "
                       "and is faster than ours. No URL: the kernel writer is off (and no key is kept).")
        intro.setWordWrap(True)
        lay.addWidget(intro)
        form = QFormLayout()
        self.url = QLineEdit(current.url)
        self.url.setPlaceholderText("http://127.0.0.1:8000/v1")
        self.url.setToolTip("The API's base URL: …/v1 (vLLM and SGLang serve http://HOST:8000/v1, "
                            "Ollama http://127.0.0.1:11434/v1)")
        self.url.textChanged.connect(lambda _t: self._url_changed())
        form.addRow("Server URL", self.url)
        self.model = QComboBox()
        self.model.setEditable(True)
        self.model.setInsertPolicy(QComboBox.NoInsert)
        self.model.lineEdit().setPlaceholderText("the model's name on the server (Test Connection lists them)")
        self.model.setEditText(current.model)
        form.addRow("Model", self.model)
        caps = QGridLayout()
        self.limits: dict[str, QSpinBox] = {}
        for i, (key, label, lo, hi, step) in enumerate(LIMITS):
            box = QSpinBox()
            box.setRange(lo, hi)
            box.setSingleStep(step)
            box.setGroupSeparatorShown(True)
            box.setValue(getattr(current, key))
            self.limits[key] = box
            caps.addWidget(QLabel(label), i // 2, 2 * (i % 2))
            caps.addWidget(box, i // 2, 2 * (i % 2) + 1)
        self.limits["rounds"].setToolTip("Proposals per region: compile errors, mismatches and timings go back "
                                         "to the model each round")
        self.limits["region_token_cap"].setToolTip("A region stops asking once its prompts and replies reach this")
        self.limits["run_token_cap"].setToolTip("A run stops asking once all its prompts and replies reach this")
        form.addRow("Limits", caps)
        lay.addLayout(form)
        lay.addWidget(self._key_box(current))
        row = QHBoxLayout()
        self.test_btn = QPushButton("Test Connection")
        self.test_btn.setToolTip("List the server's models (GET URL/models)")
        self.test_btn.clicked.connect(self.test_connection)
        row.addWidget(self.test_btn)
        self.test_result = QLabel("")
        self.test_result.setWordWrap(True)
        self.test_result.setTextInteractionFlags(Qt.TextSelectableByMouse)
        row.addWidget(self.test_result, 1)
        lay.addLayout(row)
        self.privacy = QLabel("")
        self.privacy.setObjectName("WriterPrivacy")
        self.privacy.setWordWrap(True)
        lay.addWidget(self.privacy)
        self.problem = QLabel("\n".join(notes))
        self.problem.setObjectName("Refusal")
        self.problem.setWordWrap(True)
        lay.addWidget(self.problem)
        self.buttons = QDialogButtonBox(QDialogButtonBox.Save | QDialogButtonBox.Cancel)
        self.buttons.accepted.connect(self.save)
        self.buttons.rejected.connect(self.reject)
        lay.addWidget(self.buttons)
        self._relay = _Relay()   # no parent: it outlives a dialog closed while a test still runs
        self._relay.done.connect(self._tested)
        self._tests = 0
        self._url_changed()

    def _key_box(self, current: WriterSettings) -> QWidget:
        box = QWidget()
        grid = QGridLayout(box)
        grid.setContentsMargins(0, 0, 0, 0)
        grid.addWidget(QLabel("API key"), 0, 0)
        self.key_mode = QButtonGroup(self)
        self.key_none = QRadioButton("None (a local server that asks for none)")
        self.key_stored = QRadioButton("Stored in my settings")
        self.key_from_env = QRadioButton("From the environment variable")
        for i, b in enumerate((self.key_none, self.key_stored, self.key_from_env)):
            self.key_mode.addButton(b, i)
            grid.addWidget(b, i, 1)
        self.key = QLineEdit(current.key)
        self.key.setEchoMode(QLineEdit.Password)
        self.key.setPlaceholderText("sk-…")
        self.key.setToolTip("Kept in your user settings file, never in a program file; the worker gets it "
                            f"through its environment ({DEFAULT_KEY_ENV}), never on its command line")
        self.show_key = QPushButton("Show")
        self.show_key.setCheckable(True)
        self.show_key.toggled.connect(lambda on: (self.key.setEchoMode(QLineEdit.Normal if on else QLineEdit.Password),
                                                  self.show_key.setText("Hide" if on else "Show")))
        grid.addWidget(self.key, 1, 2)
        grid.addWidget(self.show_key, 1, 3)
        self.key_env = QLineEdit(current.key_env)
        self.key_env.setPlaceholderText(DEFAULT_KEY_ENV)
        self.key_env.setToolTip("Read from the studio's environment when a run starts; nothing is stored")
        grid.addWidget(self.key_env, 2, 2, 1, 2)
        grid.setColumnStretch(2, 1)
        (self.key_none, self.key_stored, self.key_from_env)[KEY_MODES.index(current.key_mode)].setChecked(True)
        self.key_mode.idToggled.connect(lambda _i, _on: self._key_mode_changed())
        self._key_mode_changed()
        return box

    def _key_mode_changed(self) -> None:
        mode = self.chosen_key_mode()
        self.key.setEnabled(mode == "stored")
        self.show_key.setEnabled(mode == "stored")
        self.key_env.setEnabled(mode == "env")

    def chosen_key_mode(self) -> str:
        return KEY_MODES[max(self.key_mode.checkedId(), 0)]

    def settings(self) -> WriterSettings:
        """What the fields say now (not yet stored)."""
        mode = self.chosen_key_mode()
        return WriterSettings(url=self.url.text().strip(), model=self.model.currentText().strip(),
                              key_mode=mode, key=self.key.text() if mode == "stored" else "",
                              key_env=self.key_env.text().strip() or DEFAULT_KEY_ENV,
                              **{k: box.value() for k, box in self.limits.items()})

    def _url_changed(self) -> None:
        ws = self.settings()
        self.privacy.setText(ws.notice())
        remote = "are sent to" in self.privacy.text()
        self.privacy.setStyleSheet("color: #d6a84a; font-weight: bold;" if remote else "")
        self.test_btn.setEnabled(bool(ws.url))

    def problems(self, ws: WriterSettings) -> str | None:
        """Why these fields cannot be saved, or None."""
        from agent_core.errors import StitchError
        if not ws.url:
            return None   # the feature off: nothing else matters
        if not ws.model:
            return "Name the model to ask (Test Connection lists the server's)"
        if ws.key_mode == "stored" and not ws.key:
            return "Type the API key, or choose None or an environment variable"
        if ws.key_mode == "env" and not ENV_NAME.fullmatch(ws.key_env):
            return f"{ws.key_env!r} is not an environment variable's name"
        try:
            ws.config().validate()
        except StitchError as e:
            return str(e)
        return None

    def save(self) -> bool:
        ws = self.settings()
        why = self.problems(ws)
        if why:
            self.problem.setText(why)
            return False
        save(self.qs, ws)
        self.problem.setText("")
        self.saved.emit(ws)
        self.accept()
        return True

    def test_connection(self) -> None:
        ws = self.settings()
        if not ws.url:
            return
        if ws.key_mode == "env" and not ws.key_value():
            self.test_result.setText(f"Note: ${ws.key_env} is not set in the studio's environment. Testing…")
        else:
            self.test_result.setText(f"Asking {ws.url.rstrip('/')}/models…")
        self._tests += 1
        self.test_btn.setEnabled(False)
        QThreadPool.globalInstance().start(_TestJob(self._tests, ws.url, ws.key_value(), self._relay))

    def _tested(self, n: int, result) -> None:
        if n != self._tests:
            return   # an earlier test, answered after a later one was asked
        self.test_btn.setEnabled(bool(self.url.text().strip()))
        if isinstance(result, str):
            self.test_result.setText(f"Connection failed: {result}")
            self.tested.emit(False, self.test_result.text())
            return
        typed = self.model.currentText()
        self.model.clear()
        self.model.addItems(result)
        self.model.setEditText(typed or (result[0] if len(result) == 1 else ""))
        shown = ", ".join(result[:8]) + (f" and {len(result) - 8} more" if len(result) > 8 else "")
        self.test_result.setText(f"Connected: {len(result)} model{'s' if len(result) != 1 else ''}"
                                 + (f" ({shown})" if result else ""))
        self.tested.emit(True, self.test_result.text())
