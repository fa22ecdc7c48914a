"""Servers the course starts listen on localhost, with a token where the server has one."""

import subprocess

from course_utils.config import checkout_root
from course_utils.observe import tensorboard


def _dry_run(target: str) -> str:
    result = subprocess.run(["make", "-n", target], cwd=checkout_root(), capture_output=True, text=True,
                            env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"})
    return result.stdout


def test_jupyterlab_listens_on_localhost_with_its_token():
    command = next(line for line in _dry_run("lab").splitlines() if "jupyter lab" in line)
    assert "--ip=127.0.0.1" in command
    assert "token" not in command.lower() and "password" not in command.lower()  # Jupyter's default: a token


def test_tensorboard_listens_on_localhost():
    assert "--host 127.0.0.1" in next(line for line in _dry_run("tensorboard").splitlines() if "tensorboard" in line)
    assert "--host 127.0.0.1" in tensorboard.command(checkout_root() / "runs")
