"""The browser suite's helpers: a Jupyter server, a notebook page in one front-end, and the explorer's controls.

Everything a student does is done through the page (keyboard, mouse); everything checked is read from the
page (the PNG bytes the ``Image`` widget shows, the greyed-out controls and the reasons printed for them),
from the kernel's messages (read off the page's own websocket: any ``error`` message or traceback on stderr
fails the check) and from the server's log. :meth:`Explorer.act` is the one assertion every test is made of:
after an action the figure must change, and nothing may go wrong anywhere.
"""

from __future__ import annotations

import base64
import json
import os
import pathlib
import re
import shutil
import signal
import socket
import struct
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "_build" / "screenshots" / "frontend"
CHAPTERS = {  # the explorer chapters: chapter -> notebook
    3: ROOT / "book" / "03_flow_attention.ipynb",
    4: ROOT / "book" / "04_mobile_attention.ipynb",
    5: ROOT / "book" / "05_mixture_of_heads.ipynb",
}
PORTS = range(8891, 8900)  # this checkout's ports for servers
TOKEN = "attnbook-frontend-suite"
FRONTEND_DIRS = ("lab", "notebook7", "classic", "selftest")

# What the front-ends themselves get wrong, whatever notebook they show (seen on a notebook holding nothing but
# a heading and an empty Image widget), never an explorer's fault; counted, and listed in the report:
# - Notebook 7 references font files it does not ship (403 "not in root static directory");
# - the classic notebook 6.5 asks for a font at about:blank (blocked by CORS, then net::ERR_FAILED), and its
#   MathJax 2 for .otf fonts it does not ship (404), on pages with math;
# - the classic notebook's Markdown renderer asks CodeMirror for a highlighting mode named after each fenced
#   block's info string, so the chapters' MyST directives (```{exercise-start} ...) become requests for
#   codemirror/mode/{exercise-start}... scripts: 404, "Refused to execute script" (the block still shows);
# - Notebook 7 throws "Cannot read properties of undefined (reading 'schema')" while it starts, and "Command
#   'filebrowser:open-path' not registered" (it has no file browser on a notebook page).
KNOWN_FRONTEND_NOISE = re.compile(
    r"/static/notebook/[0-9a-f]+\.(woff2?|ttf|eot)(\?|$)|^about:blank$|/static/components/MathJax/fonts/.*\.otf$"
    r"|/codemirror/mode/%7B[a-z-]+%7D"
)
KNOWN_PAGE_NOISE = {
    "notebook7": re.compile(
        r"^Cannot read properties of undefined \(reading 'schema'\)$|^Command 'filebrowser:open-path' not registered\.$"
    )
}
KNOWN_CONSOLE_NOISE = re.compile(
    r"^Access to font at 'about:blank' from origin 'http://127\.0\.0\.1:\d+' has been blocked"
    r"|^Refused to execute script from 'http://127\.0\.0\.1:\d+/[^']*/codemirror/mode/%7B[a-z-]+%7D"
)


def free_port() -> int:
    """A free port of this checkout's range; pytest-xdist workers search disjoint halves of it (no race)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    ports = PORTS
    if worker.startswith("gw"):
        half = len(PORTS) // 2
        ports = PORTS[:half] if int(worker[2:]) % 2 == 0 else PORTS[half:]
    for port in ports:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {PORTS.start}..{PORTS.stop - 1}")


class JupyterServer:
    """A Jupyter server of one front-end environment, on 127.0.0.1, in a temporary directory of its own.

    ``app`` is ``"lab"`` (JupyterLab 4, which also serves Notebook 7 under /notebooks/) or ``"notebook"``
    (the classic notebook 6.5). The server's own output (and so every kernel's stderr) goes to ``log``.
    """

    def __init__(self, env: pathlib.Path, app: str, workdir: pathlib.Path, notebooks: list[pathlib.Path]):
        self.env, self.app, self.workdir = env, app, workdir
        self.root = workdir / "notebooks"
        self.home = workdir / "home"
        self.root.mkdir(parents=True)
        self.home.mkdir()
        for frontend in FRONTEND_DIRS:  # one copy per front-end: no two pages ever share a document or kernel
            (self.root / frontend).mkdir()
            for nb in notebooks:
                shutil.copy(nb, self.root / frontend / nb.name)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = workdir / "server.log"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 90) -> None:
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "IPYTHON"))},
            "HOME": str(self.home),
            "JUPYTER_CONFIG_DIR": str(self.home / "config"),
            "JUPYTER_DATA_DIR": str(self.home / "data"),
            "JUPYTER_RUNTIME_DIR": str(self.home / "runtime"),
            "IPYTHONDIR": str(self.home / "ipython"),
            "ATTNBOOK_FAST": "1",
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "PYTHONWARNINGS": "default",
        }
        env.pop("MPLBACKEND", None)
        args = [
            str(self.env / "bin" / "python"),
            "-m",
            "jupyterlab" if self.app == "lab" else "notebook",
            "--no-browser",
            "--allow-root",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={self.port}",
            "--ServerApp.port_retries=0",
            f"--ServerApp.root_dir={self.root}",
            f"--IdentityProvider.token={TOKEN}" if self.app == "lab" else f"--NotebookApp.token={TOKEN}",
        ]
        if self.app == "lab":
            args.append("--LabApp.extension_manager=readonly")  # no queries to a package index
        else:
            args += [f"--NotebookApp.notebook_dir={self.root}", f"--NotebookApp.port={self.port}"]
            args = [a for a in args if not a.startswith("--ServerApp.")]
            args += ["--NotebookApp.ip=127.0.0.1", "--NotebookApp.port_retries=0"]
        self.log_file = open(self.log, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            args, cwd=self.root, env=env, stdout=self.log_file, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the {self.app} server exited at start:\n{self.log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/api/status?token={TOKEN}", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.3)
        raise RuntimeError(f"the {self.app} server did not answer within {timeout} s:\n{self.log.read_text()[-3000:]}")

    def notebook_url(self, frontend: str, name: str) -> str:
        path = {"lab": "lab/tree", "notebook7": "notebooks", "classic": "notebooks"}[frontend]
        reset = "reset&" if frontend == "lab" else ""  # JupyterLab: no documents restored from a workspace
        return f"{self.url}/{path}/{frontend}/{name}?{reset}token={TOKEN}"

    def log_problems(self, since: int = 0) -> list[str]:
        """Tracebacks and errors in the server's log after byte ``since`` (kernels' stderr lands here too)."""
        text = self.log.read_text(errors="replace")[since:]
        bad = []
        for line in text.splitlines():
            if "Traceback" in line or "Exception in comm_msg" in line or re.match(r"\[E[ \d]", line):
                bad.append(line.strip())
        return bad

    def log_size(self) -> int:
        return self.log.stat().st_size if self.log.exists() else 0

    def stop(self) -> None:
        """Shut the kernels down, stop the server's whole process group, wait for it."""
        if self.proc is None:
            return
        try:
            req = urllib.request.Request(f"{self.url}/api/kernels?token={TOKEN}")
            with urllib.request.urlopen(req, timeout=5) as r:
                for kernel in json.loads(r.read()):
                    urllib.request.urlopen(
                        urllib.request.Request(f"{self.url}/api/kernels/{kernel['id']}?token={TOKEN}", method="DELETE"),
                        timeout=10,
                    )
        except OSError:
            pass
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self.log_file.close()
        self.proc = None


# ------------------------------------------------------------------------------------------ the kernel


def decode_frame(payload) -> dict | None:
    """One Jupyter websocket frame as a message dict (JSON text, the v1 binary protocol, or the legacy binary
    framing for messages with buffers), or None when it is none of these."""
    try:
        if isinstance(payload, str):
            return json.loads(payload)
        data = bytes(payload)
        n = struct.unpack_from("<Q", data, 0)[0]
        if 2 <= n <= 64 and len(data) >= 8 * (n + 1):  # v1.kernel.websocket.jupyter.org
            offsets = struct.unpack_from(f"<{n}Q", data, 8)
            parts = [data[offsets[i] : offsets[i + 1] if i + 1 < n else len(data)] for i in range(n)]
            channel = parts[0].decode()
            if channel in ("shell", "iopub", "stdin", "control"):
                header, parent, _, content = (json.loads(p) for p in parts[1:5])
                return {"channel": channel, "header": header, "parent_header": parent, "content": content}
        nbufs = struct.unpack_from(">I", data, 0)[0]  # legacy: JSON then buffers
        offsets = struct.unpack_from(f">{nbufs}I", data, 4)
        end = offsets[1] if nbufs > 1 else len(data)
        return json.loads(data[offsets[0] : end])
    except (ValueError, struct.error, UnicodeDecodeError, IndexError):
        return None


@dataclass
class KernelMonitor:
    """Everything the kernel says to the page: busy/idle, errors, stderr; attached to the page's websockets."""

    last_status: str = "unknown"
    last_message: float = field(default_factory=time.monotonic)
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    messages: int = 0
    replies: int = 0  # execute_reply messages: one per cell the kernel has finished (or aborted)

    def attach(self, page) -> None:
        page.on("websocket", self._on_socket)

    def _on_socket(self, ws) -> None:
        if "/api/kernels/" in ws.url:
            ws.on("framereceived", self._on_frame)

    def _on_frame(self, payload) -> None:
        msg = decode_frame(payload)
        if not msg:
            return
        self.messages += 1
        self.last_message = time.monotonic()
        kind = (msg.get("header") or {}).get("msg_type") or msg.get("msg_type")
        content = msg.get("content") or {}
        if kind == "execute_reply":
            self.replies += 1
        elif kind == "status":
            self.last_status = content.get("execution_state", self.last_status)
        elif kind == "error":
            self.errors.append(f"{content.get('ename')}: {content.get('evalue')}")
        elif kind == "stream" and content.get("name") == "stderr":
            text = content.get("text", "")
            (self.errors if re.search(r"Traceback|Error\b|Exception", text) else self.warnings).append(text.strip())

    def wait_idle(self, page, *, quiet: float = 0.3, timeout: float = 120) -> None:
        """Until the kernel is idle and has said nothing for ``quiet`` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            page.wait_for_timeout(100)  # lets Playwright deliver the websocket events
            if self.last_status == "idle" and time.monotonic() - self.last_message > quiet:
                return
        raise AssertionError(f"the kernel did not go idle within {timeout} s (last status {self.last_status})")


# ------------------------------------------------------------------------------------------- the page


class NotebookPage:
    """A notebook open in one front-end: ``"lab"`` (JupyterLab 4), ``"notebook7"`` or ``"classic"`` (6.5)."""

    def __init__(self, page, server: JupyterServer, frontend: str, name: str):
        self.page, self.server, self.frontend, self.name = page, server, frontend, name
        self.kernel = KernelMonitor()
        self.page_errors: list[str] = []
        self.console_errors: list[str] = []
        self.noise: list[str] = []
        self._bad_responses: list[str] = []
        self.kernel.attach(page)
        page.on("pageerror", lambda e: self.page_errors.append(str(e)))
        page.on("console", self._on_console)
        page.on("response", self._on_response)
        page.on("requestfailed", self._on_failed)
        self.log_start = server.log_size()
        self._outputs_seen = 0

    def _on_console(self, message) -> None:
        if message.type == "error":
            self.console_errors.append(message.text)

    def _on_response(self, response) -> None:
        if response.status >= 400:
            url = response.url.split("?")[0]
            (self.noise if KNOWN_FRONTEND_NOISE.search(url) else self._bad_responses).append(f"{response.status} {url}")

    def _on_failed(self, request) -> None:
        url = request.url.split("?")[0]
        (self.noise if KNOWN_FRONTEND_NOISE.search(url) else self._bad_responses).append(f"failed {url}")

    def open(self) -> None:
        self.page.goto(self.server.notebook_url(self.frontend, self.name))
        if self.frontend == "classic":
            self.page.wait_for_function(
                "() => window.Jupyter && Jupyter.notebook && Jupyter.notebook.kernel"
                " && Jupyter.notebook.kernel.is_connected()",
                timeout=90_000,
            )
        else:
            self.page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90_000)
            self.page.wait_for_function(
                "() => [...document.querySelectorAll('.jp-Toolbar-kernelStatus, .jp-KernelStatus, "
                "[data-status]')].length > 0 || document.querySelector('.jp-Notebook') !== null",
                timeout=90_000,
            )
        self.kernel.wait_idle(self.page, quiet=1.0)

    def code_cells(self) -> int:
        """The notebook's code cells with something to run (front-ends skip empty ones)."""
        cells = json.loads((self.server.root / self.frontend / self.name).read_text())["cells"]
        return sum(1 for c in cells if c["cell_type"] == "code" and "".join(c["source"]).strip())

    def run_all(self, timeout: float = 300) -> None:
        """Run every cell as a student does (the front-end's own Run All), then wait until the kernel has
        answered every one of them (its execute replies, read off the websocket) and is idle."""
        expected = self.kernel.replies + self.code_cells()
        if self.frontend == "classic":
            self.page.evaluate("() => Jupyter.notebook.execute_all_cells()")
        else:
            self.page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).first.click()
            self.page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).first.click()
        deadline = time.monotonic() + timeout
        while self.kernel.replies < expected:
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{self.name}: {self.kernel.replies - expected + self.code_cells()} of {self.code_cells()} "
                    f"cells ran within {timeout} s"
                )
            self.page.wait_for_timeout(250)
        self.kernel.wait_idle(self.page, quiet=1.0)

    def error_outputs(self) -> list[str]:
        """Error and traceback outputs visible in the notebook."""
        selector = (
            ".output_error, .output_stderr"
            if self.frontend == "classic"
            else ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']"
        )
        texts = self.page.locator(selector).all_inner_texts()
        return [t.strip()[:400] for t in texts if re.search(r"Traceback|Error|Exception", t)]

    def problems(self) -> list[str]:
        """Everything that went wrong so far: in the page, its console, the kernel, the server's log."""
        noise = KNOWN_PAGE_NOISE.get(self.frontend)
        out = [f"page error: {e}" for e in self.page_errors if not (noise and noise.match(e))]
        # "Failed to load resource" console lines come with every failed response: the known noise of the
        # front-end (counted in self.noise) accounts for as many of them
        failed = [e for e in self.console_errors if e.startswith("Failed to load resource")]
        out += [
            f"console error: {e}" for e in self.console_errors if e not in failed and not KNOWN_CONSOLE_NOISE.match(e)
        ]
        out += [f"console error: {e}" for e in failed[len(self.noise) :]]
        out += [f"HTTP {r}" for r in self._bad_responses]
        out += [f"kernel: {e}" for e in self.kernel.errors]
        out += [f"notebook output: {e}" for e in self.error_outputs()[self._outputs_seen :]]
        out += [f"server log: {e}" for e in self.server.log_problems(self.log_start)]
        return out

    def forget_problems(self) -> None:
        """Start counting problems afresh (the suite's self-test provokes them on purpose)."""
        self.page_errors.clear()
        self.console_errors.clear()
        self._bad_responses.clear()
        self.kernel.errors.clear()
        self.log_start = self.server.log_size()
        self._outputs_seen = len(self.error_outputs())

    def assert_clean(self, when: str) -> None:
        problems = self.problems()
        assert not problems, f"{self.frontend} / {self.name}: after {when}:\n  " + "\n  ".join(problems)

    def explorer(self) -> Explorer:
        image = self.page.locator(".widget-image").last
        image.wait_for(state="attached", timeout=30_000)
        return Explorer(self, image.locator("xpath=.."))


# --------------------------------------------------------------------------------------- the explorer


@dataclass
class Action:
    frontend: str
    chapter: str
    control: str
    action: str
    result: str
    seconds: float = 0.0


class Explorer:
    """One explorer on the page: its root box, its controls found by their visible labels, its figure."""

    def __init__(self, nb: NotebookPage, root):
        self.nb, self.page, self.root = nb, nb.page, root
        self.log: list[Action] = []
        self._step: dict[str, float] = {}  # label -> pixels per step, measured by arrow keys
        self.ipywidgets7 = self.root.locator(".ui-slider").count() > 0

    # --- reading the page

    def image_bytes(self) -> bytes:
        data = self.root.locator(":scope > .widget-image").evaluate(
            """async img => {
                const r = await fetch(img.src);
                const b = new Uint8Array(await r.arrayBuffer());
                let s = '';
                for (let i = 0; i < b.length; i += 8192) s += String.fromCharCode(...b.subarray(i, i + 8192));
                return btoa(s);
            }"""
        )
        return base64.b64decode(data)

    def text(self) -> str:
        return self.root.inner_text()

    def _exact(self, text: str):
        # widgets pad some labels with a zero-width space, which is no whitespace to a regular expression
        return re.compile(rf"^[\s\u200b]*{re.escape(text)}[\s\u200b]*$")

    def slider(self, label: str):
        return self.root.locator(".widget-hslider").filter(
            has=self.page.locator(".widget-label", has_text=self._exact(label))
        )

    def checkbox(self, label: str):
        return self.root.locator(".widget-checkbox").filter(has_text=self._exact(label)).locator("input")

    def toggle(self, label: str):
        return self.root.locator(".widget-toggle-buttons button").filter(has_text=self._exact(label))

    def button(self, label: str):
        return self.root.locator("button.widget-button").filter(has_text=self._exact(label))

    def dropdown(self, label: str):
        return (
            self.root.locator(".widget-dropdown")
            .filter(has=self.page.locator(".widget-label", has_text=self._exact(label)))
            .locator("select")
        )

    def slider_value(self, label: str) -> str:
        readout = self.slider(label).locator(".widget-readout")
        return (
            readout.input_value() if readout.evaluate("e => e.tagName") == "INPUT" else readout.inner_text()
        ).strip()

    def _handle(self, label: str):
        return self.slider(label).locator(".ui-slider-handle" if self.ipywidgets7 else ".noUi-handle")

    def is_disabled(self, kind: str, label: str) -> bool:
        if kind == "slider":
            return self.slider(label).evaluate(
                "s => !!s.querySelector('.noUi-target[disabled], .ui-slider-disabled, .ui-state-disabled')"
            )
        element = {"checkbox": self.checkbox, "toggle": self.toggle, "button": self.button, "dropdown": self.dropdown}[
            kind
        ](label)
        return element.first.is_disabled()

    def reason_shown(self, label: str) -> str | None:
        """The reason the explorer prints for a greyed-out control, if any."""
        match = re.search(rf"⊘\s*{re.escape(label)} is greyed out: ([^\n⊘]+)", self.text())
        return match.group(1).strip() if match else None

    # --- doing things

    def _slider_key(self, label: str, key: str) -> None:
        handle = self._handle(label)
        handle.scroll_into_view_if_needed()
        handle.focus()
        self.page.keyboard.press(key)

    def _handle_x(self, label: str) -> float:
        box = self._handle(label).bounding_box()
        return box["x"] + box["width"] / 2

    def _slider_drag(self, label: str, steps: float) -> None:
        """Drag the handle by about ``steps`` slider steps (negative: to the left), with the mouse."""
        handle = self._handle(label)
        handle.scroll_into_view_if_needed()
        hbox = handle.bounding_box()
        x0, y = hbox["x"] + hbox["width"] / 2, hbox["y"] + hbox["height"] / 2
        dx = steps * self._step_px(label)
        self.page.mouse.move(x0, y)
        self.page.mouse.down()
        for i in range(1, 6):
            self.page.mouse.move(x0 + dx * i / 5, y)
        self.page.mouse.up()

    def _step_px(self, label: str) -> float:
        """Pixels per slider step: measured by the last arrow key on this slider, else from noUiSlider's ARIA
        attributes (ipywidgets 8)."""
        if label in self._step:
            return self._step[label]
        if self.ipywidgets7:
            raise AssertionError(f"drag {label!r}: press an arrow key on it first (it measures the step)")
        track = self.slider(label).locator(".noUi-target").bounding_box()
        n = self._handle(label).evaluate(
            "h => { const t = h.closest('.noUi-target').noUiSlider; const o = t.options.step || 1;"
            " return Math.round((h.getAttribute('aria-valuemax') - h.getAttribute('aria-valuemin')) / o); }"
        )
        return track["width"] / max(int(n), 1)

    def do(self, kind: str, label: str, how: str) -> None:
        """Operate a control: a slider by ``key:<Key>`` or ``drag:<steps>``; a checkbox by ``click``; a toggle
        or button by ``click``; a dropdown by ``select:<option>``."""
        if kind == "slider" and how.startswith("key:"):
            self._slider_key(label, how[4:])
        elif kind == "slider" and how.startswith("drag:"):
            self._slider_drag(label, float(how[5:]))
        elif kind == "checkbox":
            self.checkbox(label).click()
        elif kind == "toggle":
            self.toggle(label).click()
        elif kind == "button":
            self.button(label).click()
        elif kind == "dropdown":
            self.dropdown(label).select_option(how.split(":", 1)[1])
        else:
            raise ValueError(f"cannot {how} a {kind}")

    def act(self, kind: str, label: str, how: str, *, expect_value: str | None = None) -> bytes:
        """Do ``how`` to the control and assert what a student would check: the figure changed (or, for a
        greyed-out control, that it is disabled and its reason is printed), the slider shows ``expect_value``
        if given, and nothing went wrong in the page, its console, the kernel or the server. Returns the new
        figure."""
        started = time.monotonic()
        before = self.image_bytes()
        if self.is_disabled(kind, label):
            reason = self.reason_shown(label)
            assert reason, f"{label!r} is disabled but the explorer does not say why:\n{self.text()}"
            self._record(label, how, f"disabled: {reason}")
            return before
        arrow = kind == "slider" and how in ("key:ArrowRight", "key:ArrowLeft")
        x_before = self._handle_x(label) if arrow else None
        self.do(kind, label, how)
        self.nb.kernel.wait_idle(self.page)
        after = self._settled_image(before)
        if arrow and (moved := abs(self._handle_x(label) - x_before)) > 0.5:
            self._step[label] = moved
        self.nb.assert_clean(f"{how} on {label!r}")
        if expect_value is not None:
            value = self.slider_value(label)
            assert value == expect_value, f"{how} on {label!r}: the slider shows {value}, expected {expect_value}"
        assert after != before, f"{how} on {label!r} did not change the figure (and the control is not disabled)"
        result = "figure changed" + (f" ({label} = {expect_value})" if expect_value else "")
        self._record(label, how, result, time.monotonic() - started)
        return after

    def expect_disabled(self, kind: str, label: str, *, because: str) -> str:
        """Assert the control is greyed out and the explorer prints a reason containing ``because``."""
        assert self.is_disabled(kind, label), f"{label!r} should be disabled ({because})"
        reason = self.reason_shown(label)
        assert reason and because in reason, f"{label!r}: reason {reason!r} does not say {because!r}"
        self._record(label, "(state check)", f"disabled: {reason}")
        return reason

    def expect_enabled(self, kind: str, label: str) -> None:
        assert not self.is_disabled(kind, label), f"{label!r} is still disabled: {self.reason_shown(label)}"
        assert self.reason_shown(label) is None, f"{label!r} is enabled but still has a reason printed"

    def _settled_image(self, before: bytes, timeout: float = 10) -> bytes:
        """The figure once the front-end has applied the kernel's update (it may lag the idle message). A kernel
        error ends the wait at once: no update is coming, and the caller's check reports the error."""
        deadline = time.monotonic() + timeout
        current = self.image_bytes()
        while current == before and not self.nb.kernel.errors and time.monotonic() < deadline:
            self.page.wait_for_timeout(200)
            current = self.image_bytes()
        return current

    def _record(self, label: str, how: str, result: str, seconds: float = 0.0) -> None:
        self.log.append(Action(self.nb.frontend, self.nb.name, label, how, result, seconds))

    def screenshot(self, name: str) -> pathlib.Path:
        """The page with the explorer's controls at the top (``name.png``) and the figure exactly as the page
        shows it (``name-figure.png``, the Image widget's PNG bytes)."""
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOTS / f"{name}.png"
        self.root.evaluate("r => r.scrollIntoView({block: 'start'})")
        self.page.wait_for_timeout(300)
        self.page.screenshot(path=str(path))
        (SCREENSHOTS / f"{name}-figure.png").write_bytes(self.image_bytes())
        return path
