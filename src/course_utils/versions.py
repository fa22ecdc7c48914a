"""The PyTorch versions the course supports: the exact pin of the default install, and the oldest release it
tests, the PyTorch of the oldest container the README recommends (notebook 00, ``python -m course_utils.devices``,
and CI's second environment).

Learners on the container routes run the container's own PyTorch, not the pin: LUMI AI Factory's images of 2026
carry 2.9 and 2.10 (the LUMI AI guide's is 2.10 on ROCm 7.0), NVIDIA's NGC 25.12 2.10. CI runs every notebook and
every real-process test on the oldest (``make test-oldest``) besides the whole suite on the pin (``make test``).

This file imports nothing, so that the Makefile can ask it before any environment exists:

    python src/course_utils/versions.py oldest      # torch==2.10.0 torchvision==0.25.0, for pip
"""

from __future__ import annotations

import sys

# The default install's pins: pyproject.toml and environment.yml pin the same (tests/test_environment.py).
PINNED = {"torch": "2.14.1", "torchvision": "0.29.1"}
# The oldest the course supports and CI tests, with the torchvision released beside it.
OLDEST = {"torch": "2.10.0", "torchvision": "0.25.0"}


def release(version: str) -> tuple[int, int]:
    """A PyTorch version's release, its major and minor number: ``2.10.0+rocm7.0`` -> ``(2, 10)``."""
    major, minor = version.split("+")[0].split(".")[:2]
    return int(major), int("".join(digit for digit in minor if digit.isdigit()) or 0)


def supported_range() -> str:
    """The range in words: ``2.10 to 2.14``."""
    return f"{'.'.join(map(str, release(OLDEST['torch'])))} to {'.'.join(map(str, release(PINNED['torch'])))}"


def is_supported(version: str) -> bool:
    """Whether a torch version lies in the range the course tests (from the oldest release to the pin's)."""
    return release(OLDEST["torch"]) <= release(version) <= release(PINNED["torch"])


def support_note(version: str) -> str:
    """One line on ``version``: the pin, inside the tested range, or outside it and what to do."""
    tested = f"the course supports and tests PyTorch {supported_range()}"
    if version.split("+")[0] == PINNED["torch"]:
        return f"the course's pin ({tested})"
    if is_supported(version):
        return f"inside the range: {tested}, pinned {PINNED['torch']}"
    side = "older than" if release(version) < release(OLDEST["torch"]) else "newer than"
    return (f"OUTSIDE the range: {side} the tested {supported_range()}; lessons may fail or differ. Use the pin "
            f"(make setup), or a container with PyTorch {supported_range()} (README, 'On LUMI')")


def requirements(which: dict[str, str]) -> list[str]:
    """pip's requirement lines for ``PINNED`` or ``OLDEST``."""
    return [f"{name}=={version}" for name, version in which.items()]


if __name__ == "__main__":
    choice = {"oldest": OLDEST, "pinned": PINNED}.get(sys.argv[1] if len(sys.argv) > 1 else "")
    if choice is None:
        sys.exit("usage: python src/course_utils/versions.py oldest|pinned")
    print(" ".join(requirements(choice)))
