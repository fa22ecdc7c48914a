import json
import subprocess
import sys

from course_utils.bench import judge, triage


def test_verdicts_on_controlled_ratios():
    assert judge(io=300, synthetic=1000, full=290)[0] == "input-bound"
    assert judge(io=3000, synthetic=1000, full=950)[0] == "compute-bound"
    assert judge(io=1020, synthetic=1000, full=800)[0] == "balanced"
    assert "0.30x" in judge(io=300, synthetic=1000, full=290)[1]


def test_a_delayed_loader_is_input_bound(quick):
    result = triage(steps=4, warmup=1, input_delay_ms=250, **{k: v for k, v in quick.items() if k != "out"})
    assert result.verdict == "input-bound", result.explanation
    assert result.io < 0.5 * result.synthetic and result.full < 0.5 * result.synthetic


def test_command_line_prints_json(tiny_root):
    result = subprocess.run(
        [sys.executable, "-m", "course_utils.bench", "--size", "ci", "--data-dir", str(tiny_root),
         "--train-samples", "128", "--batch-size", "16", "--workers", "0", "--steps", "3", "--warmup", "1", "--json"],
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    triaged = json.loads(result.stdout.strip().splitlines()[-1])
    assert triaged["verdict"] in ("input-bound", "compute-bound", "balanced") and triaged["io"] > 0
