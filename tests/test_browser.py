"""The course in a real browser, as a learner meets it: JupyterLab started by `make lab`, Debian's Chromium
driven by Playwright, notebooks 00-02 opened through their address. Notebook 00, the smallest, is run whole from
the Run menu; in 01 and 02 a learner runs the cells that lead to the view the browser must show (01: the set-up,
the training, TensorBoard's view; 02: the set-up and the live monitor), each with Ctrl+Enter: nbval runs every
cell of every notebook already, what only a browser can tell is whether the views render. No cell run may show an
error, and saving from the browser must leave the checkout's notebooks byte for byte as they were.

CI (``CI`` set, as ``.ci/run`` runs) must have Chromium, which ``.ci/run`` installs: there a missing one is
a failure. Elsewhere the test is skipped without it. Each test writes a screenshot of its notebook to its
temporary folder; ``make screenshots`` (``COURSE_UPDATE_SCREENSHOTS=1``) refreshes the reference images in
``img/screenshots/`` from the same run.
"""

from __future__ import annotations

import contextlib
import difflib
import io
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import psutil
import pytest

from course_utils.atomic_files import write_atomic
from course_utils.config import checkout_root
from course_utils.observe import tensorboard
from course_utils.parallel.process_group import free_port

pytestmark = pytest.mark.slow

REQUIRED = bool(os.environ.get("CI"))  # set in CI: there, a missing browser is a failure
UPDATE_VARIABLE = "COURSE_UPDATE_SCREENSHOTS"  # 1: the run also refreshes img/screenshots/ (make screenshots)
SCREENSHOTS = checkout_root() / "img" / "screenshots"
VIEWPORT = {"width": 1280, "height": 800}
START_SECONDS = 180  # make lab: the data check, then JupyterLab's start
RUN_SECONDS = 600  # all cells of one notebook at the ci size, on a busy 2-core machine


@dataclass(frozen=True)
class Lab:
    """A running `make lab`: where it answers and what its notebooks write."""

    url: str
    token: str
    runs: Path
    tensorboard_port: int
    make_pid: int = 0  # the `make lab` process

    def api(self, path: str, method: str = "GET") -> object:
        request = urllib.request.Request(f"{self.url}/api/{path}", method=method,
                                         headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=10) as response:
            body = response.read()
        return json.loads(body) if body else None


def _chromium() -> str:
    program = shutil.which("chromium")
    if program is None:
        reason = "Debian's chromium is not installed (as root: apt-get install chromium)"
        if REQUIRED:
            pytest.fail(reason)
        pytest.skip(reason)
    return program


def _wait_until_up(lab: Lab, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"make lab exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            lab.api("status")
            return
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"JupyterLab did not answer within {START_SECONDS} s:\n{log.read_text()[-3000:]}")


def _stop_tensorboard(port: int) -> None:
    """End the TensorBoard that notebook 01's %tensorboard started on ``port``: it outlives its kernel."""
    from tensorboard import manager

    for info in manager.get_all():
        if info.port == port:
            with contextlib.suppress(ProcessLookupError):  # gone already
                os.kill(info.pid, signal.SIGTERM)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """`make lab` as a learner runs it (localhost, a token, no browser tab of its own) on free ports, at the ci
    size, with the runs in a temporary folder, a live kernel (no CI switch, nothing that turns views off), and a
    new user's JupyterLab settings."""
    _chromium()
    base = tmp_path_factory.mktemp("lab")
    port = free_port()
    lab = Lab(url=f"http://127.0.0.1:{port}", token=secrets.token_hex(16), runs=base / "runs",
              tensorboard_port=free_port())
    env = {**os.environ, "JUPYTER_TOKEN": lab.token, "COURSE_SIZE": "ci", "COURSE_RUNS_DIR": str(lab.runs),
           "COURSE_INTERACTIVE": "1", tensorboard.PORT_VARIABLE: str(lab.tensorboard_port),
           "JUPYTER_CONFIG_DIR": str(base / "jupyter-config"), "JUPYTER_RUNTIME_DIR": str(base / "runtime")}
    env.pop("CI", None)
    log = base / "lab.log"
    with log.open("w") as stream:
        process = subprocess.Popen(["make", "lab", f"VENV={sys.prefix}", "HOST=127.0.0.1", f"PORT={port}",
                                    "BROWSER=0"], cwd=checkout_root(), env=env, stdout=stream,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_until_up(lab, process, log)
        yield replace(lab, make_pid=process.pid)
    finally:
        with contextlib.suppress(OSError):
            lab.api("shutdown", method="POST")  # JupyterLab ends its kernels and exits, and with it make
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        _stop_tensorboard(lab.tensorboard_port)


@pytest.fixture(scope="module")
def browser(lab: Lab):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:  # the system's Chromium: Playwright's own download is not used
        chromium = playwright.chromium.launch(executable_path=_chromium(), headless=True)
        yield chromium
        chromium.close()


# Every code cell's prompt and the text of its error-coloured outputs (tracebacks and stderr streams).
_CELLS_JS = """() => [...document.querySelectorAll('.jp-Notebook .jp-CodeCell')].map(cell => ({
    prompt: cell.querySelector('.jp-InputArea-prompt').textContent.trim(),
    stderr: [...cell.querySelectorAll('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')]
            .map(output => output.textContent)}))"""
# Run All marks every code cell queued ([*]) at once; the run is over when none is left queued: each ran
# ([n]) or, after an error, was taken off the queue ([ ]).
_PROMPTS_JS = ("[...document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputArea-prompt')]"
               ".map(p => p.textContent.trim())")
_STARTED_JS = f"() => {_PROMPTS_JS}[0] !== '[ ]:'"
_DONE_JS = f"""() => !{_PROMPTS_JS}.includes('[*]:')
    && document.querySelector('.jp-Notebook-ExecutionIndicator')?.dataset.status === 'idle'"""
KERNEL_READY = re.compile(r"^Python 3 \(ipykernel\) \| Idle$")
_ERROR = re.compile(r"Traceback|^\w*(Error|Exception)\b", re.MULTILINE)


def _open(page, lab: Lab, name: str) -> None:
    """Notebook ``name`` opened through its address, once its kernel has started."""
    page.goto(f"{lab.url}/lab/tree/notebooks/{name}?reset&token={lab.token}")  # reset: only this notebook open
    page.get_by_text(KERNEL_READY).wait_for(timeout=120_000)  # the status bar, once the kernel has started


def _run_all(page, lab: Lab, name: str) -> list[dict]:
    """Open notebook ``name`` through its address, run every cell from the Run menu, wait for the kernel."""
    _open(page, lab, name)
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
    page.wait_for_function(_STARTED_JS, timeout=30_000)
    page.wait_for_function(_DONE_JS, timeout=RUN_SECONDS * 1000, polling=1000)
    return page.evaluate(_CELLS_JS)


def _run_cells(page, lab: Lab, name: str, beginnings: tuple[str, ...]) -> list[dict]:
    """Open notebook ``name``, run the code cells whose source begins with each of ``beginnings``, in that order,
    as a learner does (click into the cell, Ctrl+Enter), each to its end."""
    _open(page, lab, name)
    cells_on_disk = json.loads((checkout_root() / "notebooks" / name).read_text())["cells"]
    sources = ["".join(cell["source"]) for cell in cells_on_disk if cell["cell_type"] == "code"]  # as shown
    numbers = []
    for beginning in beginnings:
        found = [number for number, source in enumerate(sources) if source.lstrip().startswith(beginning)]
        assert len(found) == 1, f"{name}: {len(found)} code cells begin with {beginning!r}"
        numbers.append(found[0])
    cells = page.locator(".jp-Notebook .jp-CodeCell")
    for number in numbers:
        editor = cells.nth(number).locator(".jp-InputArea-editor")
        editor.scroll_into_view_if_needed()
        editor.click()  # into the cell's code: a click beside it, on the collapser, would hide the code (and save so)
        page.keyboard.press("Control+Enter")
        page.wait_for_function(f"() => /^\\[\\d+\\]:$/.test({_PROMPTS_JS}[{number}])", timeout=RUN_SECONDS * 1000,
                               polling=1000)
    every = page.evaluate(_CELLS_JS)
    return [every[number] for number in numbers]


def _save_from_the_browser(page, notebook: Path) -> None:
    """Ctrl+S in the notebook, as a learner saves it; returns once the server has written the file. Jupyter's
    "atomic" save copies the file to ``.~NAME``, writes NAME in place, then removes the copy: a file read while the
    copy is there may be cut short."""
    before = notebook.stat().st_mtime_ns
    copy = notebook.with_name(".~" + notebook.name)
    page.locator(".jp-Notebook").first.click(position={"x": 5, "y": 5})
    page.keyboard.press("Control+s")
    deadline = time.monotonic() + 30
    while notebook.stat().st_mtime_ns == before or copy.exists():
        assert time.monotonic() < deadline, f"saving {notebook.name} from the browser wrote nothing"
        time.sleep(0.2)


def _screenshot(page, target, name: str, tmp_path: Path) -> Path:
    """The page with ``target`` in view, as a small palette PNG; also into img/screenshots/ when asked."""
    from PIL import Image

    target.evaluate("element => element.scrollIntoView({block: 'center'})")
    target.wait_for(state="visible")
    page.wait_for_timeout(1000)  # JupyterLab paints the cells just scrolled into view (it skips those out of view)
    image = Image.open(io.BytesIO(page.screenshot())).convert("RGB").quantize(colors=64, dither=Image.Dither.NONE)
    path = tmp_path / f"{Path(name).stem}.png"
    image.save(path, optimize=True)
    if os.environ.get(UPDATE_VARIABLE) == "1":
        write_atomic(SCREENSHOTS / path.name, lambda stream: stream.write(path.read_bytes()))
    return path


def _the_report(page, lab: Lab):
    return page.locator(".jp-Notebook .jp-CodeCell").nth(1)


def _tensorboard_loads(page, lab: Lab):
    """Notebook 01's last code cell shows TensorBoard in a frame: the frame holds TensorBoard's app, which lists
    the run the notebook trained."""
    frame_element = page.locator(".jp-Notebook iframe").first
    frame_element.scroll_into_view_if_needed(timeout=60_000)
    assert f":{lab.tensorboard_port}" in frame_element.get_attribute("src")
    frame = frame_element.content_frame
    assert frame.locator("head title").text_content(timeout=60_000) == "TensorBoard"
    frame.get_by_text(re.compile(r"^\s*01_baseline")).first.wait_for(timeout=60_000)
    return frame_element


def _live_monitor_renders(page, lab: Lab):
    """Notebook 02's live view: a widget whose table holds the monitor's latest readings."""
    view = page.locator(".jp-Notebook .widget-html table").first
    view.scroll_into_view_if_needed(timeout=30_000)
    headers = view.locator("th").all_text_contents()
    assert {"index", "phase", "utilization_percent", "memory_used_mib", "power_watts"} <= set(headers)
    assert view.locator("tbody tr").count() >= 1
    return view


# Each notebook: the view it must show, and the beginnings of the cells to run for it (none: Run All Cells).
NOTEBOOKS: dict[str, tuple[Callable, tuple[str, ...]]] = {
    "00_setup.ipynb": (_the_report, ()),
    "01_single_gpu_baseline.ipynb": (_tensorboard_loads, ("from IPython.display", "summary = train(",
                                                          "tensorboard.show(")),
    "02_monitoring.ipynb": (_live_monitor_renders, ("from IPython.display", "with Monitor(")),
}


def test_a_cells_python_is_the_courses_as_after_activating_the_venv(lab):
    """`!python -m course_utils.doctor` in a cell, and `python` in JupyterLab's terminal, run the first `python` on
    the PATH the kernels and terminals get from JupyterLab's server: `make lab` puts the venv's first."""
    servers = []
    for process in psutil.Process(lab.make_pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):  # a short-lived child may end while it is read
            if any("jupyter" in Path(part).name for part in process.cmdline()[:2]):
                servers.append(process)
    assert servers, "no JupyterLab server under make lab"
    path = servers[0].environ()["PATH"]
    assert shutil.which("python", path=path) == str(Path(sys.prefix) / "bin" / "python"), path


@pytest.mark.parametrize("name", list(NOTEBOOKS))
def test_a_notebook_runs_in_the_browser_without_errors_and_saving_it_leaves_the_checkout_clean(
        lab, browser, name, tmp_path):
    notebook = checkout_root() / "notebooks" / name
    committed = notebook.read_bytes()
    page = browser.new_page(viewport=VIEWPORT)
    try:
        shows, beginnings = NOTEBOOKS[name]
        cells = _run_cells(page, lab, name, beginnings) if beginnings else _run_all(page, lab, name)
        errors = [f"cell {number} {cell['prompt']}\n{text[-1500:]}" for number, cell in enumerate(cells)
                  for text in cell["stderr"] if _ERROR.search(text)]
        assert not errors, f"{name} shows errors:\n" + "\n".join(errors)
        not_run = [number for number, cell in enumerate(cells) if not re.fullmatch(r"\[\d+\]:", cell["prompt"])]
        assert not not_run, f"{name}: code cells {not_run} did not run ({[c['prompt'] for c in cells]})"
        shown = shows(page, lab)
        assert _screenshot(page, shown, name, tmp_path).stat().st_size > 0
        _save_from_the_browser(page, notebook)
        saved = notebook.read_bytes()
        assert saved == committed, f"saving {name} from JupyterLab changed the file:\n" + "\n".join(
            difflib.unified_diff(committed.decode().splitlines(), saved.decode().splitlines(), lineterm="", n=2))
    finally:
        page.close()
        for kernel in lab.api("kernels"):  # each notebook's kernel ends with its test: the next one has the cores
            lab.api(f"kernels/{kernel['id']}", method="DELETE")
        if notebook.read_bytes() != committed:  # the checkout stays as it was, whatever failed
            write_atomic(notebook, lambda stream: stream.write(committed))
