"""The course's pinned requirements (pyproject.toml's dependencies and test extra) for pip, less the packages a
container brings: jobs/lumi/setup_venv.sh and jobs/cloud/setup_ngc_venv.sh install them over a container's PyTorch.

    python jobs/course_requirements.py --without torch torchvision nvidia-dali [--constraints FILE ...]

``--without NAME`` leaves out NAME and the packages whose names start with ``NAME-``. ``--constraints`` names pip
constraints files (NGC's PyTorch containers set PIP_CONSTRAINT to one that pins every package they ship): a package
such a file pins is listed without the course's pin, so that the container's tested version stays and pip does not
stop on the conflict. The pins set aside are listed on standard error.
"""

from __future__ import annotations

import argparse
import re
import sys

try:
    import tomllib
except ImportError:  # Python 3.10: the TOML reader that pip carries
    from pip._vendor import tomli as tomllib

NAME = re.compile(r"[A-Za-z0-9._-]+")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def constrained_names(paths: list[str]) -> set[str]:
    """The packages that pip constraints files pin."""
    names = set()
    for path in paths:
        with open(path) as file:
            for line in file:
                match = NAME.match(line.strip())
                if match and not line.lstrip().startswith(("#", "-")):
                    names.add(canonical(match.group(0)))
    return names


def requirements(pyproject: str, without: list[str], constrained: set[str]) -> tuple[list[str], list[str]]:
    """The requirement lines to install, and the course's pins left to the constraints instead."""
    with open(pyproject, "rb") as file:
        project = tomllib.load(file)["project"]
    lines, relaxed = [], []
    for requirement in project["dependencies"] + project["optional-dependencies"]["test"]:
        name = canonical(NAME.match(requirement).group(0))
        if any(name == left or name.startswith(left + "-") for left in map(canonical, without)):
            continue
        if name in constrained:
            marker = requirement.partition(";")[2]
            lines.append(name + (f"; {marker.strip()}" if marker else ""))
            relaxed.append(requirement)
        else:
            lines.append(requirement)
    return lines, relaxed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pyproject", default="pyproject.toml", help="the course's pyproject.toml")
    parser.add_argument("--without", nargs="*", default=[], help="packages the environment already has")
    parser.add_argument("--constraints", nargs="*", default=[], help="pip constraints files to give way to")
    args = parser.parse_args(argv)
    lines, relaxed = requirements(args.pyproject, args.without, constrained_names(args.constraints))
    print("\n".join(lines))
    if relaxed:
        print(f"course_requirements: the container's constraints decide these versions instead of the course's "
              f"pins: {', '.join(relaxed)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
