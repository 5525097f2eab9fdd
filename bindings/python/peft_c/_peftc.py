"""The ``peftc`` console command of the wheel: runs the peftc executable shipped inside the package."""

import os
import sys


def main() -> int:
    exe = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "peftc")
    if not os.access(exe, os.X_OK):
        print(f"peftc: {exe} is missing: this peft_c package was not installed from a wheel built "
              "with the library (pip install ./bindings/python)", file=sys.stderr)
        return 127
    os.execv(exe, ["peftc", *sys.argv[1:]])
    return 127  # not reached: execv replaces the process


if __name__ == "__main__":
    sys.exit(main())
