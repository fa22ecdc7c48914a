"""An experiment as data: named variants of a run, run in order by one runner; one device against DataParallel
and DDP as such variants, where a row the learner adds trains with its own options."""

import json

import pytest

from course_utils.experiments.modes import ONE_DEVICE, compare_modes, first_of
from course_utils.experiments.runs import Variant, run_variants
from course_utils.training.options import TrainOptions

DDP_DEFAULT_BUCKET_MB = TrainOptions().bucket_cap_mb


def test_each_variant_runs_in_order_as_a_row_with_its_name():
    seen = []

    def run(variant):
        seen.append(variant.name)
        return {"lr": variant.options.get("lr", 0.1)}

    table = run_variants([Variant("base"), Variant("half the rate", lr=0.05)], run)
    assert seen == ["base", "half the rate"]
    assert table.to_dict("records") == [{"variant": "base", "lr": 0.1}, {"variant": "half the rate", "lr": 0.05}]
    assert Variant("DDP, 64 MB buckets!", bucket_cap_mb=64).folder_name == "ddp-64-mb-buckets"


def test_two_variants_of_one_name_are_refused_before_any_run():
    ran = []
    with pytest.raises(ValueError, match="two variants are named 'DDP'"):
        run_variants([Variant("DDP"), Variant("DDP", bucket_cap_mb=1)], lambda variant: ran.append(variant) or {})
    assert not ran


def test_two_variants_whose_names_differ_only_in_case_or_punctuation_are_refused_before_any_run():
    """They would share one run folder, the second run replacing the first's files."""
    ran = []
    with pytest.raises(ValueError, match="the variants 'DDP, 1 MB' and 'ddp 1 MB!' differ only in case or "
                                         "punctuation, so both would run in the folder 'ddp-1-mb'"):
        run_variants([Variant("one device"), Variant("DDP, 1 MB", bucket_cap_mb=1), Variant("ddp 1 MB!")],
                     lambda variant: ran.append(variant) or {})
    assert not ran


@pytest.mark.parametrize(("option", "why"), [
    ("out", "each mode's run folder is out / the mode's name; pass out= to compare_modes"),
    ("batch_size", "every mode trains the same batch per device; pass batch_size= to compare_modes"),
    ("max_steps", "every mode trains the same number of steps; pass steps= to compare_modes"),
])
def test_a_mode_that_sets_what_the_comparison_sets_is_refused_by_name_before_any_run(tmp_path, option, why):
    """An out or batch_size of its own clashed with the comparison's in a raw TypeError; a max_steps of its own
    trained other steps than the other modes, in silence."""
    wrong = Variant("DDP, longer", distributed="ddp", **{option: 8 if option != "out" else str(tmp_path / "mine")})
    with pytest.raises(ValueError) as refused:
        compare_modes([ONE_DEVICE, wrong], out=tmp_path)
    assert str(refused.value) == (f"variant 'DDP, longer' sets {option}, which the experiment sets for every run: "
                                  f"{option}: {why}")
    assert not list(tmp_path.iterdir())


def test_steps_given_twice_to_the_comparison_are_refused_before_any_run(tmp_path):
    """max_steps= among the common options was the number every mode trained while steps= judged the DDP run's
    reuse: two numbers for one thing."""
    with pytest.raises(ValueError, match="steps=3 and max_steps=5 both set the steps every mode trains"):
        compare_modes([ONE_DEVICE], steps=3, max_steps=5, out=tmp_path)
    assert not list(tmp_path.iterdir())


def test_a_mode_that_is_no_way_of_running_is_refused_before_any_run(tmp_path):
    with pytest.raises(ValueError, match="mode 'FSDP': distributed='fsdp'; a mode runs as one of none, dp, ddp"):
        compare_modes([ONE_DEVICE, Variant("FSDP", distributed="fsdp")], out=tmp_path)
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
@pytest.mark.distributed
def test_a_row_the_learner_adds_trains_with_its_own_options(tiny_root, tmp_path):
    ways = [ONE_DEVICE, Variant("DDP, 1 MB buckets", distributed="ddp", bucket_cap_mb=1)]
    table = compare_modes(ways, steps=3, out=tmp_path, size="ci", data_dir=str(tiny_root), train_samples=128,
                          test_samples=32, device="cpu", workers=0)
    assert list(table["variant"]) == ["one device", "DDP, 1 MB buckets"]
    assert list(table["mode"]) == ["one device", "DDP, 1 MB buckets, 2 ranks"]
    assert list(table["distributed"]) == ["none", "ddp"] and first_of(table, "ddp")["variant"] == "DDP, 1 MB buckets"
    config = json.loads((tmp_path / "ddp-1-mb-buckets" / "summary.json").read_text())["config"]
    assert config["bucket_cap_mb"] == 1.0 != DDP_DEFAULT_BUCKET_MB  # its own option, not the default's
    assert first_of(table, "dp") is None
