"""docs/benchmarks.md, written a section at a time: each benchmark replaces its own `## title`
section (or appends it) and leaves the others as they are."""
import os

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # benchmarks/
ROOT = os.path.dirname(HERE)
BENCHMARKS_MD = os.path.join(ROOT, "docs", "benchmarks.md")


def write_section(path: str, title: str, body: str) -> None:
    """Replaces (or appends) the `## title` section of a markdown file."""
    text = open(path).read() if os.path.exists(path) else "# Benchmarks\n"
    header = f"## {title}\n"
    start = text.find(header)
    section = header + "\n" + body.strip() + "\n\n"
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        end = text.find("\n## ", start + len(header))
        text = text[:start] + section + (text[end + 1:] if end >= 0 else "")
    with open(path, "w") as f:
        f.write(text.rstrip("\n") + "\n")


def rows_table(headers, rows: dict, cells) -> str:
    """A markdown table: `headers` (the first names the rows; a right-aligned column unless its
    name ends with "<"), one line per entry of `rows` ({name: result}), its cells
    `cells(result)`; a result {"error": ...} (a child that failed) gets one cell saying so."""
    names = [h.rstrip("<") for h in headers]
    align = ["---"] + ["---" if h.endswith("<") else "---:" for h in headers[1:]]
    lines = ["| " + " | ".join(names) + " |", "|" + "|".join(align) + "|"]
    for name, r in rows.items():
        body = [f"error: {r['error']}"] + [""] * (len(headers) - 2) if "error" in r else cells(r)
        lines.append("| " + " | ".join([name] + list(body)) + " |")
    return "\n".join(lines)

