import json

import pandas as pd
import pytest

from course_utils.lessons import triage as triage_command
from course_utils.lessons.data_loading import recommend
from course_utils.lessons.triage import VERDICTS, judge, triage


def test_verdicts_on_controlled_ratios():
    assert judge(io=300, synthetic=1000, full=290)[0] == "input-bound"
    assert judge(io=3000, synthetic=1000, full=950)[0] == "compute-bound"
    assert judge(io=1020, synthetic=1000, full=800)[0] == "balanced"
    verdict, explanation = judge(io=5000, synthetic=1000, full=800)
    assert verdict == "not overlapped" and "250 us" in explanation  # 1/800 - 1/1000 s per image
    assert "0.30x" in judge(io=300, synthetic=1000, full=290)[1]


def test_a_delayed_loader_is_input_bound(quick):
    # 250 ms per batch of 8 caps the loader at 32 images/s, far below what the model trains even on a busy CPU
    # (batches of 32 allowed 128 images/s, and a loaded 2-core runner trained at less than twice that).
    options = {**{k: v for k, v in quick.items() if k != "out"}, "batch_size": 8}
    result = triage(steps=4, warmup=1, input_delay_ms=250, **options)
    assert result.verdict == "input-bound", result.explanation
    assert result.io < 0.5 * result.synthetic and result.full < 0.5 * result.synthetic


@pytest.mark.slow
def test_command_line_prints_json(tiny_root, capsys):
    code = triage_command.main(["--size", "ci", "--data-dir", str(tiny_root), "--train-samples", "128", "--batch-size",
                                "16", "--workers", "0", "--steps", "3", "--warmup", "1", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    triaged = json.loads(out.strip().splitlines()[-1])
    assert triaged["verdict"] in VERDICTS and triaged["io"] > 0


def test_recommendation_follows_training_not_the_loader_alone():
    # Two workers make the loader fastest but take cores from the model: training is slower with them.
    sweep = pd.DataFrame([
        {"workers": 0, "pin_memory": False, "persistent_workers": False, "prefetch_factor": None,
         "io": 9000, "full": 1500},
        {"workers": 1, "pin_memory": False, "persistent_workers": True, "prefetch_factor": 2, "io": 5000, "full": 1480},
        {"workers": 2, "pin_memory": False, "persistent_workers": True, "prefetch_factor": 4,
         "io": 12000, "full": 1300},
    ])
    assert recommend(sweep) == {"workers": 0, "pin_memory": False, "persistent_workers": False, "prefetch_factor": None}
    sweep.loc[0, "full"] = 1000  # now training without workers waits for data: the cheapest good one wins
    assert recommend(sweep) == {"workers": 1, "pin_memory": False, "persistent_workers": True, "prefetch_factor": 2}
