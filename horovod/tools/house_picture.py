"""Draws the package as floors: each package a room on the floor of its layer, imports as arrows between rooms.

``python -m horovod.tools.house_picture docs/figures/architecture.png`` redraws the picture in docs/architecture.md
from the code's own imports (needs matplotlib). An arrow that points up is drawn red: it breaks the layering.
"""
from __future__ import annotations

import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Dict, List, Tuple

from horovod.tools import floors
from horovod.tools.house import Module, load_package

__all__ = ["rooms", "draw", "main"]

def _room(name: str) -> str:
    parts = name.split(".")
    if len(parts) > 2 and ".".join(parts[1:3]) in floors.ROOMS:
        return ".".join(parts[1:3])     # a subpackage with a floor of its own (the Spark estimators)
    return parts[1] if len(parts) > 1 else "__init__"


def _floor(room: str) -> int:
    floor = floors.floor_of("horovod" if room == "__init__" else f"horovod.{room}")
    return floors.FLOORS.index(floor) if floor else len(floors.FLOORS) - 1


def rooms(modules: Dict[str, Module]) -> Tuple[Dict[str, int], Counter, Dict[str, List[str]]]:
    """(lines per room, import count per (from room, to room), the room's biggest modules) for the package."""
    lines: Dict[str, int] = defaultdict(int)
    edges: Counter = Counter()
    members: Dict[str, List[Tuple[int, str]]] = defaultdict(list)
    for module in modules.values():
        room = _room(module.name)
        lines[room] += module.lines
        members[room].append((module.lines, module.name.split(".", 2)[-1] if module.name.count(".") > 1 else
                              ("__init__" if module.path.name == "__init__.py" and room != "__init__" else "")))
        for target in module.imports:
            other = _room(target)
            if other != room and target != "horovod":
                edges[(room, other)] += 1
    biggest = {room: [name for _, name in sorted(found, reverse=True)
                      if name and (name != "__init__" or len(found) == 1)][:8]
               for room, found in members.items()}
    return dict(lines), edges, biggest


def _layout(lines: Dict[str, int]) -> Dict[str, Tuple[float, float, float]]:
    """Room -> (x, y, width): rooms of a floor side by side, widths by lines of code (with a floor minimum)."""
    by_floor: Dict[int, List[str]] = defaultdict(list)
    for room in sorted(lines, key=lambda r: -lines[r]):
        by_floor[_floor(room)].append(room)
    boxes = {}
    for floor, members in by_floor.items():
        weights = [max(lines[m], 600) for m in members]
        total, x = sum(weights), 0.0
        for member, weight in zip(members, weights):
            width = 0.94 * weight / total
            boxes[member] = (x + 0.03, floor, width)
            x += width
    return boxes


def _wrap(names: List[str], width: float) -> str:
    per_line = max(int(width * 140), 12)
    out, line = [], ""
    for name in names:
        if line and len(line) + len(name) + 2 > per_line:
            out.append(line)
            line = ""
        line = f"{line}, {name}" if line else name
    out.append(line)
    return "\n".join(out[:2])


def draw(root: Path, path: Path) -> None:
    """Write the picture of the package at ``root`` to ``path`` (PNG)."""
    import matplotlib       # optional: only this tool needs it
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines, edges, biggest = rooms(load_package(root))
    boxes = _layout(lines)
    fig, ax = plt.subplots(figsize=(14, 9))
    for room, (x, floor, width) in boxes.items():
        ax.add_patch(plt.Rectangle((x, floor + 0.15), width - 0.01, 0.55, facecolor="#c9dbec", edgecolor="#345"))
        label = f"{room}/" if biggest.get(room) else f"{room}.py"
        ax.text(x + 0.005, floor + 0.62, label, fontsize=9, weight="bold", va="top")
        ax.text(x + 0.005, floor + 0.36, f"{lines[room]:,} lines", fontsize=7, color="#345")
        ax.text(x + 0.005, floor + 0.2, _wrap(biggest.get(room, []), width), fontsize=6, color="#555")
    for (src, dst), count in edges.items():
        (x0, f0, w0), (x1, f1, w1) = boxes[src], boxes[dst]
        upward = _floor(dst) > _floor(src)
        ax.annotate("", xy=(x1 + w1 / 2, f1 + (0.7 if not upward else 0.15)),
                    xytext=(x0 + w0 / 2, f0 + (0.15 if not upward else 0.7)),
                    arrowprops=dict(arrowstyle="->", color="#c0392b" if upward else "#7f8c8d",
                                    lw=0.5 + min(count, 20) / 10, alpha=0.7))
    for index, title in enumerate(floors.FLOORS):
        ax.text(-0.01, index + 0.42, title, ha="right", fontsize=9, style="italic")
    ax.set_xlim(-0.2, 1.0)
    ax.set_ylim(0, len(floors.FLOORS))
    ax.axis("off")
    ax.set_title("horovod-py: floors from the ground up; arrows are imports (grey down, red up)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


def main(argv: List[str] = None) -> int:
    """``python -m horovod.tools.house_picture OUT.png [PACKAGE_DIR]``."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print(__doc__)
        return 2
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parents[1]
    draw(root, Path(argv[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
