import pytest
import torch
from torchvision import models as tv

from course_utils.training import models

STEM_7x7, STEM_3x3 = 64 * 3 * 7 * 7, 64 * 3 * 3 * 3


@pytest.mark.parametrize("name", models.CLASSIFIER_NAMES)
def test_output_shape(name):
    model = models.build(name).eval()
    with torch.no_grad():
        assert model(torch.randn(2, 3, 32, 32)).shape == (2, 100)


@pytest.mark.parametrize("name", list(models.RESNETS))
def test_cifar_resnets_differ_from_torchvision_only_in_the_stem(name):
    reference = models.count_parameters(getattr(tv, name)(num_classes=100))
    assert models.count_parameters(models.build(name)) == reference - STEM_7x7 + STEM_3x3
    assert models.count_parameters(models.build(name, image_size=224)) == reference


def test_resnet152_has_about_60_million_parameters_at_224():
    count = models.parameter_table(("resnet152",), image_size=224)[0]["parameters"]
    assert 58e6 < count < 61e6


def test_group_norm_model_has_no_batch_norm():
    assert models.has_batch_norm(models.build("small_cnn"))
    assert not models.has_batch_norm(models.build("small_cnn_gn"))


def test_unknown_model_names_the_choices():
    with pytest.raises(models.UnknownModelError, match="resnet18"):
        models.build("vgg16")
