"""Every code exercise of the notebooks works: its committed cell leaves the check "not yet", and the
collapsed solution, put in its place, makes the check say "done". The cells run as a learner runs them, in
one Jupyter kernel: the notebook's first code cell (its imports), the cells the exercises need (tagged
``exercise-context``), the exercise and the check, then the solution and the check again. Then the checks of
01-05 are fed what learners do to the exercise cell: right answers written other ways and typical wrong edits,
each of which must get "Not yet" and a hint about what it did; and every exercise has two staged hints before
its solution."""

import json
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from course_utils.lessons import baseline, data_loading, monitoring, precision, profiling
from course_utils.tooling.exercises import Check

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("[0-9]*.ipynb"))
SOLUTION = re.compile(r"<details><summary>Solution (\d+)</summary>\s*```python\n(.*?)```", re.S)


def _source(cell: dict) -> str:
    return "".join(cell["source"])


def _tagged(cells: list[dict], tag: str) -> list[dict]:
    return [cell for cell in cells if tag in cell.get("metadata", {}).get("tags", [])]


def _exercises() -> list[tuple[Path, str]]:
    found = []
    for notebook in NOTEBOOKS:
        cells = json.loads(notebook.read_text())["cells"]
        found += [(notebook, number) for cell in cells if cell["cell_type"] == "markdown"
                  for number, _ in SOLUTION.findall(_source(cell))]
    return found


def _run(notebook: Path, number: str) -> tuple[str, str]:
    """The check's output after the committed exercise cell ran, then after its solution ran in its place, in one
    fresh kernel: a learner runs the cell as it is, reads "not yet", edits it and runs it and the check again."""
    cells = json.loads(notebook.read_text())["cells"]
    first = next(cell for cell in cells if cell["cell_type"] == "code")
    solution = dict(SOLUTION.findall("".join(_source(c) for c in cells if c["cell_type"] == "markdown")))[number]
    exercise = _source(_tagged(cells, f"exercise-{number}")[0])
    check = _source(_tagged(cells, f"check-{number}")[0]) + "\ncheck.done"
    sources = [_source(first)] + [_source(cell) for cell in _tagged(cells, "exercise-context")]
    sources += [exercise, check, solution, check]
    built = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in sources])
    NotebookClient(built, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(notebook.parent)}}
                   ).execute()
    return _said(built.cells[-3]), _said(built.cells[-1])


def _said(cell) -> str:
    return "".join(o.get("text", "") + o.get("data", {}).get("text/plain", "") for o in cell.outputs
                   if o.get("name") != "stderr")  # PyTorch's warnings are not the check's verdict


def test_every_notebook_from_01_to_05_has_a_code_exercise():
    numbered = {notebook.name[:2] for notebook, _ in _exercises()}
    assert {"01", "02", "03", "04", "05"} <= numbered


@pytest.mark.parametrize("notebook, number", _exercises(), ids=lambda value: getattr(value, "stem", value))
def test_the_solution_does_what_the_exercise_asks_and_the_committed_cell_does_not(notebook, number, monkeypatch):
    monkeypatch.setenv("COURSE_SIZE", "ci")
    untouched, solved = _run(notebook, number)
    assert untouched.startswith("Not yet: ") and untouched.rstrip().endswith("False"), untouched
    assert solved.startswith("Done: ") and solved.rstrip().endswith("True"), solved


# What learners do to the exercise cells of 01-05, fed to the checks in this process: the notebook's cell with
# each edit made as text, run, and its function given to the check. SOLUTION stands for the collapsed solution.
SOLUTION_EDIT = "solution"
ZERO_GRAD = "    optimizer.zero_grad(set_to_none=True)\n"
STEP_FIRST = ("    loss.backward()\n    optimizer.step()\n", "    optimizer.step()\n    loss.backward()\n")
SCALED_BACKWARD = "    scaler.scale(loss).backward()\n"
UNSCALED_RETURN = "    return [parameter.grad / scaler.get_scale() for parameter in model.parameters()]"
PLAIN_RETURN = "    return [parameter.grad for parameter in model.parameters()]"
NEW_SCALER = "    scaler = torch.amp.GradScaler(images.device.type)\n"
AUTOCAST = ("    with torch.autocast(images.device.type, dtype=torch.float16):\n"
            "        loss = nn.functional.cross_entropy(model(images), labels)\n")
NO_SCALER = [(NEW_SCALER, ""), (SCALED_BACKWARD, "    loss.backward()\n"), (UNSCALED_RETURN, PLAIN_RETURN)]
LARGEST = '    return int(rows["batch_size"].max())  # the largest batch: not yet the answer'
BEST_WITHIN = ('    best = rows.loc[rows["images_per_second"].idxmax()]\n'
               '    close = rows[rows["images_per_second"] >= best["images_per_second"] * (1 - {spread})]\n'
               '    return int(close["batch_size"].min())')
ACTIVE = "def changed_profile_steps(model, optimizer, batches, device, active=2):"
FORWARD = ('            with record_function("forward"):\n'
           '                loss = nn.functional.cross_entropy(model(images), labels)')
LOSS_INSIDE = ('            with record_function("forward"):\n                outputs = model(images)\n'
               '                with record_function("loss"):\n'
               '                    loss = nn.functional.cross_entropy(outputs, labels)')
LOSS_AFTER = ('            with record_function("forward"):\n                outputs = model(images)\n'
              '            with record_function("loss"):\n'
              '                loss = nn.functional.cross_entropy(outputs, labels)')

EDITS = [
    # 01: move zero_grad
    ("01", SOLUTION_EDIT, True, "never clears the gradients"),
    ("01", [(ZERO_GRAD, "    # optimizer.zero_grad(set_to_none=True)\n")], True, "fell faster at first, then climbed"),
    ("01", [(ZERO_GRAD, ""), ("    loss.backward()\n", "    loss.backward()\n" + ZERO_GRAD)], True,
     "the weights never change"),
    ("01", [(ZERO_GRAD, ""),
            ("    loss.backward()\n", "    loss.backward()\n    model.zero_grad(set_to_none=False)\n")],
     True, "the optimizer finds no gradients"),
    ("01", [], False, "as `step` does"),
    ("01", [("    optimizer.step()\n", "")], False, "nothing was updated: your step never calls `optimizer.step()`"),
    ("01", [("    optimizer.step()\n", ""), (ZERO_GRAD, "")], False, "never calls `optimizer.step()`"),
    ("01", [("    loss.backward()\n", "")], False, "never calls `loss.backward()`"),
    ("01", [(ZERO_GRAD, ""), ("    optimizer.step()\n", "    optimizer.step()\n" + ZERO_GRAD)], False,
     "clears the gradients after `optimizer.step()`"),
    ("01", [STEP_FIRST], False, "calls `optimizer.step()` before `loss.backward()` (40 of 40"),
    ("01", [(ZERO_GRAD, ""), STEP_FIRST], False, "changed in place the weights backward still needed"),
    ("01", [(ZERO_GRAD, ZERO_GRAD + "    optimizer.param_groups[0]['lr'] = 0.1\n")], False, "something else changed"),
    ("01", [(ZERO_GRAD, ""), ("    loss.backward()\n", "    (2 * loss).backward()\n")], False,
     "something else changed"),
    ("01", [(ZERO_GRAD, ZERO_GRAD + "    optimizer.param_groups[0]['lr'] = 0.0\n")], False, "a learning rate of 0"),
    # 02: the batch where throughput stops growing
    ("02", SOLUTION_EDIT, True, "known sweeps"),
    ("02", [(LARGEST, '    best = rows["images_per_second"].max()\n'
                      '    gap = (best - rows["images_per_second"]) / best\n'
                      '    return int(rows.loc[gap <= rows["spread"], "batch_size"].min())')], True, "known sweeps"),
    ("02", [], False, "the largest batch that fit"),
    ("02", [(LARGEST, BEST_WITHIN.format(spread="0.05"))], False, "resnet18"),
    ("02", [(LARGEST, '    rows = rows.sort_values("batch_size")\n'
                      '    gain = rows["images_per_second"].pct_change().shift(-1)\n'
                      '    return int(rows.loc[gain < rows["spread"], "batch_size"].min())')], False,
     "compare each batch with the best"),
    ("02", [('results[(results["model"] == model) & (results["status"] == "ok")]',
             'results[results["status"] == "ok"]'),
            (LARGEST, BEST_WITHIN.format(spread='best["spread"]'))], False, "The smallest batch within"),
    # 03: the profiler's schedule and a range
    ("03", SOLUTION_EDIT, True, "inside `forward`"),
    ("03", [("schedule=schedule(wait=1, warmup=1, active=active)", "schedule=schedule(wait=1, warmup=1, active=3)"),
            ("for _ in range(2 + active)", "for _ in range(5)"), (FORWARD, LOSS_INSIDE)], True, "inside `forward`"),
    ("03", [], False, "recorded 2 iterations"),
    ("03", [(ACTIVE, ACTIVE.replace("=2", "=3"))], False, "0 ranges named `loss`"),
    ("03", [(FORWARD, LOSS_INSIDE)], False, "the loop must run all of them"),
    ("03", [("schedule=schedule(wait=1, warmup=1, active=active)", "schedule=schedule(wait=1, warmup=1, active=3)"),
            (FORWARD, LOSS_INSIDE)], False, "the loop must run all of them"),
    ("03", [(ACTIVE, ACTIVE.replace("=2", "=3")), (FORWARD, LOSS_AFTER)], False, "not inside a `forward` range"),
    ("03", [(ACTIVE, ACTIVE.replace("=2", "=3")), (FORWARD, LOSS_INSIDE.replace('"loss"', '"Loss"'))], False,
     "0 ranges named `loss`"),
    # 04: workers hide a slow loader
    ("04", SOLUTION_EDIT, True, "the workers hide the delay"),
    ("04", [("num_workers=0", "num_workers=8, prefetch_factor=4, persistent_workers=True")], True,
     "the workers hide the delay"),
    ("04", [], False, "the model would wait for data"),
    ("04", [("num_workers=0", "num_workers=2")], False, "the model would wait for data"),
    ("04", [(",\n                      collate_fn=DelayedCollate(delay_seconds)", ""),
            ("num_workers=0", "num_workers=6")], False, "no longer makes batches"),
    ("04", [("DelayedCollate(delay_seconds)", "DelayedCollate(0)")], False, "no longer makes batches"),
    ("04", [("batch_size=batch_size", "batch_size=batch_size // 4"), ("num_workers=0", "num_workers=6")], False,
     "no longer makes batches"),
    # 05: drop the GradScaler
    ("05", SOLUTION_EDIT, True, "underflowed"),
    ("05", [(NEW_SCALER, "    scaler = torch.amp.GradScaler(images.device.type, enabled=False)\n")], True,
     "underflowed"),
    ("05", [(NEW_SCALER, ""), (SCALED_BACKWARD, ""),
            (UNSCALED_RETURN, "    return list(torch.autograd.grad(loss, list(model.parameters())))")], True,
     "underflowed"),
    ("05", [(AUTOCAST, "    model.half()\n    loss = nn.functional.cross_entropy(model(images.half()), labels)\n"),
            *NO_SCALER], True, "underflowed"),
    ("05", [], False, "they are the scaled pass's"),
    ("05", [(AUTOCAST, "    loss = nn.functional.cross_entropy(model(images), labels)\n"), *NO_SCALER], False,
     "they are fp32's, bit for bit"),
    ("05", [(NEW_SCALER, ""), (SCALED_BACKWARD, "    loss.backward()\n"),
            (UNSCALED_RETURN, "    return [parameter.grad / 65536 for parameter in model.parameters()]")], False,
     "smaller than fp32's"),
    ("05", [(SCALED_BACKWARD, "    loss.backward()\n")], False, "smaller than fp32's"),
    ("05", [(UNSCALED_RETURN, PLAIN_RETURN)], False, "the gradients of a scaled loss, not divided back"),
    ("05", [("dtype=torch.float16", "dtype=torch.bfloat16"), *NO_SCALER], False, "they are a bf16 pass's"),
    ("05", [(UNSCALED_RETURN, "    scaler.unscale_(torch.optim.SGD(model.parameters(), lr=0.1))\n" + PLAIN_RETURN)],
     False, "they are the scaled pass's"),
    ("05", [*NO_SCALER[:2], (UNSCALED_RETURN, "    return [next(model.parameters()).grad]")], False,
     "one gradient per parameter"),
]


def _exercise_function(prefix: str, edits) -> object:
    """The function the exercise cell of notebook ``prefix`` defines, after ``edits`` (or the solution)."""
    notebook = next(path for path in NOTEBOOKS if path.name.startswith(prefix))
    cells = json.loads(notebook.read_text())["cells"]
    if edits == SOLUTION_EDIT:
        source = dict(SOLUTION.findall("".join(_source(c) for c in cells if c["cell_type"] == "markdown")))["1"]
    else:
        source = _source(_tagged(cells, "exercise-1")[0])
        for old, new in edits:
            assert old in source, f"{notebook.name}'s exercise cell no longer holds {old!r}"
            source = source.replace(old, new)
    namespace: dict = {}
    exec(compile(source, f"{notebook.name} exercise", "exec"), namespace)
    return namespace[CHECKS[prefix][1]]


CHECKS = {"01": (baseline.check_zero_grad, "changed_step"), "02": (monitoring.check_saturation, "saturating_batch"),
          "03": (profiling.check_profile, "changed_profile_steps"),
          "04": (data_loading.check_hidden_delay, "slow_loader"), "05": (precision.check_underflow, "fp16_gradients")}


@pytest.mark.parametrize("prefix, edits, done, said", EDITS,
                         ids=[f"{prefix}-{i}-{'done' if done else 'not yet'}" for i, (prefix, _, done, _) in
                              enumerate(EDITS)])
def test_each_check_says_done_only_for_what_the_exercise_asks(prefix, edits, done, said):
    check = CHECKS[prefix][0](_exercise_function(prefix, edits))
    assert isinstance(check, Check) and check.done is done, str(check)
    assert str(check).startswith("Done: " if done else "Not yet: ") and said in check.text, str(check)


def test_the_loaders_check_judges_the_workers_not_the_other_work_on_the_machine():
    """Two processes that spin on the machine's two cores (a CI run beside other work, a shared login node)
    slowed the solution's batches to one every 84 ms once; the check still reads that six workers made six batches
    at once, and that two make two, which is not enough."""
    spinning = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        six = data_loading.check_hidden_delay(_exercise_function("04", [("num_workers=0", "num_workers=6")]))
        two = data_loading.check_hidden_delay(_exercise_function("04", [("num_workers=0", "num_workers=2")]))
    finally:
        for process in spinning:
            process.kill()
            process.wait()
    assert six.done and "made up to **6** batches at once" in six.text, str(six)
    assert not two.done and "made up to **2** batches at once" in two.text, str(two)


def test_overlapping_spans_are_counted_at_their_most():
    assert data_loading.most_at_once([(0, 1), (1, 2), (2, 3)]) == 1  # one after another: an end before a start
    assert data_loading.most_at_once([(0, 4), (1, 2), (1.5, 3), (3.5, 5)]) == 3
    assert data_loading.most_at_once([]) == 0


def test_the_zero_grad_solution_text_agrees_with_the_checks_own_numbers():
    """The solution says: without zero_grad the loss first falls faster than with the gradients cleared, then
    climbs above where it started. The check's 40 steps must show both, or the text must change."""
    cells = json.loads(next(p for p in NOTEBOOKS if p.name.startswith("01")).read_text())["cells"]
    text = "".join(_source(c) for c in cells if "<summary>Solution 1</summary>" in _source(c))
    assert "fall even faster than with the gradients cleared" in text and "climbs above where it started" in text
    accumulated, cleared = (baseline._train(baseline._reference_step(order)).losses for order in
                            ("accumulates", "clears"))
    early = baseline.EARLY_STEPS - 1
    assert accumulated[early] < cleared[early] and accumulated[-1] > accumulated[0]


def _hinted(cells: list[dict], start: int) -> bool:
    """Whether a first and then a second hint come after cell ``start`` and before the exercise's solution."""
    text = ""
    for cell in cells[start + 1:]:
        if "solution" in cell["metadata"].get("tags", []):
            break
        source = _source(cell)
        text += source.split("<summary>Solution")[0] if cell["cell_type"] == "markdown" else ""
        if "<summary>Solution" in source:
            break
    first, second = text.find("<summary>First hint</summary>"), text.find("<summary>Second hint</summary>")
    return 0 <= first < second


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda path: path.stem)
def test_every_exercise_has_two_staged_hints_before_its_solution(notebook):
    cells = json.loads(notebook.read_text())["cells"]
    exercises = [i for i, cell in enumerate(cells) if any(tag == "exercise" or tag.startswith("exercise-")
                                                          for tag in cell["metadata"].get("tags", []))]
    assert all(_hinted(cells, i) for i in exercises), [i for i in exercises if not _hinted(cells, i)]
