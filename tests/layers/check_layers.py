"""Structure guard of src/ (docs/architecture.md, "Layers"). Fails when:
- a file includes a header of a higher layer, or of a sibling (the order is core, then gguf and
  safetensors side by side, then checkpoint, peft, serve, capi; a layer is the first folder under src/);
- modules depend on each other in a circle, directly or through others (a module is a header and
  its source file: `x.hpp` and `x.cpp`; `x.cpp` including `y.hpp` makes x depend on y);
- an include names a header that does not exist under src/ (a stale path after a move).

usage: check_layers.py SRC_DIR     (check a tree)
       check_layers.py --self-test  (check that a tree with each kind of problem fails)
"""
import pathlib
import re
import sys

# Each layer's level: a file may include its own layer and lower levels. The two file formats are
# siblings on one level and never include each other; `checkpoint` above them knows both.
LEVELS = {"core": 0, "gguf": 1, "safetensors": 1, "checkpoint": 2, "peft": 3, "serve": 4, "capi": 5}
LAYERS = list(LEVELS)
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def layer_of(relative: str) -> str | None:
    first = relative.split("/", 1)[0]
    return first if first in LEVELS else None


def problems_of(src: pathlib.Path) -> list[str]:
    files = sorted(p for p in src.rglob("*") if p.suffix in (".hpp", ".cpp", ".h"))
    problems = []
    graph = {}
    for path in files:
        relative = path.relative_to(src).as_posix()
        own = layer_of(relative)
        includes = [name for name in INCLUDE.findall(path.read_text(encoding="utf-8")) if name != "peft_c.h"]
        graph[relative] = includes
        for name in includes:
            if not (src / name).is_file():
                problems.append(f"{relative} includes {name}, which is not a file under src/")
                continue
            theirs = layer_of(name)
            if own is None or theirs is None:
                problems.append(f"{relative} includes {name}: both must lie in one of {LAYERS}")
            elif LEVELS[theirs] > LEVELS[own]:
                problems.append(f"{relative} ({own}) includes {name} ({theirs}), a higher layer")
            elif LEVELS[theirs] == LEVELS[own] and theirs != own:
                problems.append(f"{relative} ({own}) includes {name} ({theirs}), a sibling layer")

    # Circles among modules: depth-first search with colours.
    depends = {}
    for relative, includes in graph.items():
        module = relative.rsplit(".", 1)[0]
        targets = depends.setdefault(module, set())
        targets.update(name.rsplit(".", 1)[0] for name in includes if (src / name).is_file())
        targets.discard(module)
    state = {}
    stack = []

    def visit(module):
        state[module] = "open"
        stack.append(module)
        for target in sorted(depends.get(module, ())):
            if state.get(target) == "open":
                circle = stack[stack.index(target):] + [target]
                problems.append("modules depend on each other: " + " -> ".join(circle))
            elif target not in state:
                visit(target)
        stack.pop()
        state[module] = "done"

    for module in sorted(depends):
        if module not in state:
            visit(module)

    return problems


def self_test() -> int:
    """A small tree with one problem of each kind: each must be reported, and the clean tree not."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        src = pathlib.Path(folder)
        files = {
            "core/a.hpp": '#include "core/b.hpp"\n',
            "core/b.hpp": "",
            "peft/c.hpp": '#include "core/a.hpp"\n',
            "serve/d.cpp": '#include "peft/c.hpp"\n#include "peft_c.h"\n',
            "gguf/f.hpp": '#include "core/a.hpp"\n',
            "checkpoint/g.hpp": '#include "gguf/f.hpp"\n',
        }
        for name, text in files.items():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            (src / name).write_text(text)
        clean = problems_of(src)
        (src / "core/b.cpp").write_text('#include "peft/c.hpp"\n')  # upward
        (src / "peft/c.cpp").write_text('#include "peft/e.hpp"\n#include "peft/gone.hpp"\n')  # stale path
        (src / "peft/e.hpp").write_text('#include "peft/c.hpp"\n')  # c -> e -> c
        (src / "safetensors").mkdir()
        (src / "safetensors/h.cpp").write_text('#include "gguf/f.hpp"\n')  # sibling
        found = problems_of(src)
    wanted = ["a higher layer", "not a file under src/", "modules depend on each other", "a sibling layer"]
    missing = [w for w in wanted if not any(w in p for p in found)]
    print("self-test: clean tree:", clean or "no problems", "; broken tree:", found)
    return 1 if clean or missing else 0


def main() -> int:
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    src = pathlib.Path(sys.argv[1])
    problems = problems_of(src)
    for problem in problems:
        print("LAYERS:", problem)
    print(f"{len(problems)} problem(s) in {src}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
